-- 0008: nothing radixjobs waits on can be held by an ordinary role, and a full notification queue
-- never fails a write (issue #11, items 5 and 6).
--
-- Locks. Advisory keys are one namespace per database that any connected role may take: a role holding
-- pg_advisory_lock(hashtext('radix.job:app.victim')) or the 'radix.doc:<NUM>' key stalled CREATE JOB and
-- document applies for everyone. Names are now serialised on rows of radix.name_locks, a table PUBLIC
-- has no privilege on: a row lock is only taken by executing a statement, and executing needs the
-- privilege (PREPARE and CREATE VIEW take TABLE locks without one: never use a table-level lock here).
-- Only a role that passed the same admission checks (CREATE on the job's schema; owning the document or
-- creating a new NUM) ever holds such a row, and then only for its own transaction. As a second line,
-- the lock waits of admission (the name; the document rows; the job row for DROP JOB) are bounded by
-- radix._bound_lock_wait (5 s, or the caller's smaller lock_timeout) and end in a one-line error naming
-- what was locked.
--
-- Notifications. NOTIFY hands its payload to a cluster-wide queue at COMMIT; a session that LISTENs and
-- then stays in a transaction stops the queue from draining, and once it is full every notifying COMMIT
-- fails ("too many notifications in the NOTIFY queue"). Wake-ups are hints (the schedulers also run on
-- timers), so radix._hint skips them while the queue is half full or more.

-- One row per job name ('job', quoted schema.name) or document NUM ('doc', NUM) ever admitted; its row lock
-- serialises admission of that name. Rows are kept (deleting one under a waiter would let two
-- admissions of the name through).
CREATE TABLE radix.name_locks (
    kind text NOT NULL CHECK (kind IN ('job', 'doc')),
    name text NOT NULL,
    PRIMARY KEY (kind, name)
);
REVOKE ALL ON radix.name_locks FROM PUBLIC;

-- Bound this transaction's lock waits: 5 s, or the caller's own lock_timeout when it is shorter.
-- Returns the setting to restore (set_config(..., true) with it) once the waits are over; an error
-- rolls the setting back with the transaction or savepoint.
CREATE FUNCTION radix._bound_lock_wait() RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    prior text := pg_catalog.current_setting('lock_timeout');
    prior_ms bigint := (SELECT s.setting::pg_catalog.int8 FROM pg_catalog.pg_settings s
                        WHERE s.name OPERATOR(pg_catalog.=) 'lock_timeout');
BEGIN
    IF prior_ms OPERATOR(pg_catalog.=) 0 OR prior_ms OPERATOR(pg_catalog.>) 5000 THEN
        PERFORM pg_catalog.set_config('lock_timeout', '5s', true);
    END IF;
    RETURN prior;
END $$;

-- Lock a name for admission until the end of the transaction (re-entrant within it); a wait past the
-- bound raises 55P03 with a one-line message.
CREATE FUNCTION radix._lock_name(kind text, name text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO radix.name_locks (kind, name) VALUES (_lock_name.kind, _lock_name.name)
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM radix.name_locks l
    WHERE l.kind OPERATOR(pg_catalog.=) _lock_name.kind AND l.name OPERATOR(pg_catalog.=) _lock_name.name
    FOR UPDATE;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION '% % is being created or changed by another transaction; try again',
        CASE kind WHEN 'job' THEN 'job' ELSE 'CRON_TABLE task' END, name
        USING ERRCODE = '55P03',
              HINT = 'Another session holds it in an open transaction (see pg_stat_activity).';
END $$;

-- A wake-up for the schedulers, skipped while the notification queue is half full or more: PostgreSQL
-- warns at that level too, and the other half is the margin against the queue filling between this
-- check and COMMIT. A skipped hint costs at most one poll period (serve --poll, the document check).
CREATE FUNCTION radix._hint(channel text, payload text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.pg_notification_queue_usage() OPERATOR(pg_catalog.<) 0.5 THEN
        PERFORM pg_catalog.pg_notify(channel, payload);
    END IF;
END $$;

REVOKE ALL ON FUNCTION radix._bound_lock_wait(), radix._lock_name(text, text) FROM PUBLIC;
-- radix._hint keeps PUBLIC's EXECUTE: it can do nothing pg_notify cannot, and the triggers below run it
-- as whichever role writes the documents.

-- -- replaced from 0002 ------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION radix._arm_state(j radix.jobs) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    anchor bigint := coalesce(j.starting_at_ns, now_ns);
    planned bigint;
BEGIN
    IF j.schedule_kind = 'every' THEN
        -- first grid point anchor + k*interval (k >= 1) after both the anchor and now
        planned := anchor + j.interval_ns * greatest(1, (greatest(now_ns - anchor, 0) / j.interval_ns) + 1);
    ELSIF j.schedule_kind = 'at' THEN
        planned := j.at_ns;  -- already past: due at once
    END IF;
    -- a plain UPDATE (NO KEY UPDATE lock) does not wait for a running attempt's KEY SHARE lock;
    -- that attempt then finds its lease gone and rolls back
    UPDATE radix.radix_system_job_state SET
        definition_version = j.definition_version,
        status = CASE WHEN j.enabled THEN 'scheduled' ELSE 'disabled' END,
        anchor_ns = anchor, planned_ns = planned,
        due_ns = CASE WHEN j.enabled THEN coalesce(planned, now_ns) END,
        attempt = 0, idempotency_key = NULL, lease_node = NULL, lease_token = NULL,
        lease_expires_at = NULL, last_error = NULL, updated_at = clock_timestamp()
    WHERE job_id = j.job_id;
    IF NOT FOUND THEN
        INSERT INTO radix.radix_system_job_state
            (job_id, definition_version, status, anchor_ns, planned_ns, due_ns, attempt)
        VALUES (j.job_id, j.definition_version, CASE WHEN j.enabled THEN 'scheduled' ELSE 'disabled' END,
                anchor, planned, CASE WHEN j.enabled THEN coalesce(planned, now_ns) END, 0);
    END IF;
    PERFORM radix._hint('radix_jobs', j.job_id::text);
END $$;

-- The name is serialised on radix.name_locks (was: an advisory lock any role could hold).
CREATE OR REPLACE FUNCTION radix._check_admission(caller oid, job_parts text[], run_as text,
                                                  if_not_exists boolean)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_schema oid := (SELECT oid FROM pg_namespace WHERE nspname = job_parts[1]);
    principal pg_roles;
    existing uuid;
    prior_timeout text;
BEGIN
    IF job_schema IS NULL THEN
        RAISE EXCEPTION 'schema % does not exist', quote_ident(job_parts[1]) USING ERRCODE = '3F000';
    END IF;
    IF NOT has_schema_privilege(caller, job_schema, 'CREATE') THEN
        RAISE EXCEPTION 'permission denied for schema %', quote_ident(job_parts[1]) USING ERRCODE = '42501',
            HINT = 'Creating a job needs the CREATE privilege on its schema.';
    END IF;
    prior_timeout := radix._bound_lock_wait();
    PERFORM radix._lock_name('job', quote_ident(job_parts[1]) || '.' || quote_ident(job_parts[2]));
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    SELECT job_id INTO existing FROM radix.jobs WHERE schema_name = job_parts[1] AND job_name = job_parts[2];
    IF FOUND THEN
        IF if_not_exists THEN
            RAISE NOTICE 'job %.% already exists, skipping', quote_ident(job_parts[1]), quote_ident(job_parts[2]);
            RETURN existing;
        END IF;
        RAISE EXCEPTION 'job %.% already exists', quote_ident(job_parts[1]), quote_ident(job_parts[2])
            USING ERRCODE = '42710';
    END IF;

    SELECT * INTO principal FROM pg_roles WHERE rolname = run_as;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role % does not exist', quote_ident(run_as) USING ERRCODE = '42704';
    END IF;
    IF NOT radix.may_act_as(caller, principal.oid) THEN
        IF principal.rolsuper THEN
            RAISE EXCEPTION 'permission denied to schedule a job as superuser %', quote_ident(run_as)
                USING ERRCODE = '42501', HINT = 'Only superusers may name a superuser principal.';
        END IF;
        RAISE EXCEPTION 'permission denied to schedule a job as role %', quote_ident(run_as)
            USING ERRCODE = '42501',
                  HINT = 'The creator must be able to SET ROLE to the principal (GRANT ... WITH SET TRUE).';
    END IF;
    IF NOT principal.rolcanlogin THEN
        RAISE EXCEPTION 'role % cannot log in', quote_ident(run_as) USING ERRCODE = '42501',
            HINT = format('Jobs run on a connection logged in as their principal: ALTER ROLE %s LOGIN.',
                          quote_ident(run_as));
    END IF;
    RETURN NULL;
END $$;

-- The wait for the job's row is bounded; the wake-up is a hint.
CREATE OR REPLACE FUNCTION radix._drop_job(creator name, job text, if_exists boolean, cascade boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    prior_timeout text := radix._bound_lock_wait();
    caller oid := radix._caller(creator);
    j radix.jobs;
BEGIN
    BEGIN
        j := radix._find_job(job);
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'job % is being changed by another transaction; try again', job USING ERRCODE = '55P03',
            HINT = 'Another session holds it in an open transaction (see pg_stat_activity).';
    END;
    -- the DELETE below may still wait for a running atomic attempt (its KEY SHARE lock), as before:
    -- that wait is bounded by the attempt's deadline
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    IF j.job_id IS NULL THEN
        IF if_exists THEN
            RAISE NOTICE 'job % does not exist, skipping', job;
            RETURN false;
        END IF;
        RAISE EXCEPTION 'job % does not exist', job USING ERRCODE = '42704';
    END IF;
    PERFORM radix._check_job_owner(j, caller);
    IF NOT cascade AND EXISTS (SELECT 1 FROM radix.radix_system_job_state
                               WHERE job_id = j.job_id AND lease_expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION 'cannot drop job %.%: an attempt is running', quote_ident(j.schema_name),
            quote_ident(j.job_name) USING ERRCODE = '55006',
            HINT = 'Wait for it to finish, or use DROP JOB ... CASCADE.';
    END IF;
    DELETE FROM radix.jobs WHERE job_id = j.job_id;
    PERFORM radix._hint('radix_jobs', j.job_id::text);
    RETURN true;
END $$;

-- -- replaced from 0004 ------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION radix._notify_document() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM radix._hint('radix_documents', OLD.num);
    ELSE
        PERFORM radix._hint('radix_documents', NEW.num);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION radix._notify_process() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM radix._hint('radix_documents', NEW.task_num);
    RETURN NULL;
END $$;

-- Every key is locked on radix.name_locks (was: advisory locks any role could hold), with bounded waits.
CREATE OR REPLACE FUNCTION radix._apply_documents(creator name, docs jsonb, single boolean) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    problems text[] := '{}';
    permission boolean := false;
    d record;
    a record;
    results jsonb := '[]';
    prior_timeout text;
BEGIN
    IF jsonb_typeof(docs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'documents must be a JSON object or a list of objects' USING ERRCODE = '22023';
    END IF;
    FOR d IN SELECT e, n::integer AS n FROM jsonb_array_elements(docs) WITH ORDINALITY AS x(e, n) LOOP
        problems := problems || ARRAY(SELECT radix._doc_prefix(d.e, d.n, single) || m
                                      FROM unnest(radix.document_problems(d.e)) m);
    END LOOP;
    problems := problems || ARRAY(
        SELECT format('NUM %s appears more than once (documents %s)', k,
                      array_to_string(array_agg(n ORDER BY n), ', '))
        FROM (SELECT radix.document_num(e) AS k, n FROM jsonb_array_elements(docs) WITH ORDINALITY AS x(e, n)) s
        WHERE k IS NOT NULL GROUP BY k HAVING count(*) > 1 ORDER BY min(n));
    IF cardinality(problems) = 0 THEN
        prior_timeout := radix._bound_lock_wait();
        -- lock every key in one order (concurrent lists cannot deadlock), then check access
        PERFORM radix._lock_name('doc', k)
        FROM (SELECT radix.document_num(e) AS k FROM jsonb_array_elements(docs) e
              ORDER BY radix.document_num(e) COLLATE "C") s;
        FOR d IN SELECT e, n::integer AS n FROM jsonb_array_elements(docs) WITH ORDINALITY AS x(e, n) LOOP
            FOR a IN SELECT * FROM radix._doc_access_problems(caller, d.e) LOOP
                problems := problems || (radix._doc_prefix(d.e, d.n, single) || a.problem);
                permission := permission OR a.permission;
            END LOOP;
        END LOOP;
    END IF;
    IF cardinality(problems) > 0 THEN
        RAISE EXCEPTION '%', CASE WHEN cardinality(problems) = 1 THEN 'CRON_TABLE document rejected: ' || problems[1]
                                  ELSE format('CRON_TABLE document rejected: %s problems', cardinality(problems)) END
            USING ERRCODE = CASE WHEN permission THEN '42501' ELSE '22023' END,
                  DETAIL = array_to_string(problems, E'\n');
    END IF;
    BEGIN
        FOR d IN SELECT e FROM jsonb_array_elements(docs) e LOOP
            results := results || radix._doc_write(caller, d.e);
        END LOOP;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'CRON_TABLE task % is being changed by another transaction; try again',
            radix.document_num(d.e) USING ERRCODE = '55P03',
            HINT = 'The scheduler or another session holds it (see pg_stat_activity).';
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    RETURN results;
END $$;
