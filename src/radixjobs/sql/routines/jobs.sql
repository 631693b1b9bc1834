-- Jobs: CREATE, ALTER and DROP JOB, and the triggers that keep a job's state in step with its row.

-- Find a job by qualified name, locking it; NULL when it does not exist.
CREATE OR REPLACE FUNCTION radix._find_job(qualified text) RETURNS radix.jobs
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    parts text[] := radix._split_qualified(qualified, 'job');
    j radix.jobs;
BEGIN
    -- NO KEY UPDATE: does not wait for the KEY SHARE lock a running attempt's frame holds (its FK)
    SELECT * INTO j FROM radix.jobs WHERE schema_name = parts[1] AND job_name = parts[2] FOR NO KEY UPDATE;
    RETURN j;
END $$;

-- DROP JOB [IF EXISTS] ... [RESTRICT | CASCADE]. Dependents are rows of tables outside schema radix
-- that reference radix.jobs by foreign key. RESTRICT refuses while an attempt holds a live claim or
-- dependents exist; CASCADE deletes the dependents and drops the job even if an attempt is running:
-- that attempt can no longer finalise. The job's own rows in radix (state, history, attempt frames,
-- idempotency keys) go with it. Dependents are handled by radix.drop_job with the caller's own rights
-- (privileges, row-level security, triggers), never with the definer's.
-- The tables with rows referencing a job by foreign key (other than radix's own), for its owner.
-- Existence is read with the definer's rights, as PostgreSQL's own RESTRICT reports dependents the
-- caller cannot read; deleting them (CASCADE) is left to radix.drop_job, with the caller's rights.
CREATE OR REPLACE FUNCTION radix._job_dependents(creator name, job text)
RETURNS TABLE (tbl regclass, col name, job_id uuid)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    caller oid := radix._caller(creator);
    parts text[] := radix._split_qualified(job, 'job');
    j radix.jobs;
    dep record;
    found_dependent boolean;
BEGIN
    SELECT * INTO j FROM radix.jobs WHERE schema_name = parts[1] AND job_name = parts[2];
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM radix._check_job_owner(j, caller);
    FOR dep IN
        SELECT c.conrelid::regclass AS t, a.attname AS c
        FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
        WHERE c.contype = 'f' AND c.confrelid = 'radix.jobs'::regclass AND cardinality(c.conkey) = 1
          AND c.connamespace <> 'radix'::regnamespace  -- the job's own rows: state, history, frames, keys
    LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE %I = $1)', dep.t, dep.c)
            INTO found_dependent USING j.job_id;
        IF found_dependent THEN
            tbl := dep.t; col := dep.c; job_id := j.job_id;
            RETURN NEXT;
        END IF;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION radix.drop_job(job text, if_exists boolean DEFAULT false, cascade boolean DEFAULT false)
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    dep record;
BEGIN
    FOR dep IN SELECT * FROM radix._job_dependents(current_user, job) LOOP
        IF NOT cascade THEN
            RAISE EXCEPTION 'cannot drop job % because other objects depend on it', job USING ERRCODE = '2BP01',
                DETAIL = format('rows of %s reference it', dep.tbl),
                HINT = 'Use DROP JOB ... CASCADE to drop the dependent objects too.';
        END IF;
        -- with the caller's own rights: its privileges, row-level security and triggers apply
        EXECUTE format('DELETE FROM %s WHERE %I = $1', dep.tbl, dep.col) USING dep.job_id;
    END LOOP;
    RETURN radix._drop_job(current_user, job, if_exists, cascade);
END $$;

-- DROP JOB's definer side. RESTRICT refuses only while an attempt really runs: the claim is held by a live node, or
-- an attempt's backend still runs (a live frame, or the state row locked by an atomic attempt). A claim
-- left by a killed node with nothing running does not count.
CREATE OR REPLACE FUNCTION radix._drop_job(creator name, job text, if_exists boolean, cascade boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    prior_timeout text := radix._bound_lock_wait();
    caller oid := radix._caller(creator);
    j radix.jobs;
    k radix.jobs;
    s radix.radix_system_job_state;
    dropped uuid[];
    uphill uuid[];
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
    SELECT * INTO s FROM radix.radix_system_job_state WHERE job_id = j.job_id;
    IF NOT cascade AND s.status = 'running' AND (
           (s.lease_expires_at > clock_timestamp() AND radix.node_alive(s.lease_node))
           OR radix.job_has_live_frame(j.job_id)
           -- an atomic attempt (or a claim in progress) holds the row: it cannot be locked now
           OR NOT EXISTS (SELECT 1 FROM radix.radix_system_job_state x WHERE x.job_id = j.job_id
                          FOR UPDATE SKIP LOCKED)) THEN
        RAISE EXCEPTION 'cannot drop job %.%: an attempt is running', quote_ident(j.schema_name),
            quote_ident(j.job_name) USING ERRCODE = '55006',
            HINT = 'Wait for it to finish, or use DROP JOB ... CASCADE.';
    END IF;
    -- the jobs that run after it: RESTRICT refuses, CASCADE drops them (whoever owns them, as PostgreSQL's
    -- DROP … CASCADE drops the views on a table). An admission of a new dependent locks this job's row first
    -- (dependencies.sql), so none appears meanwhile.
    dropped := ARRAY(SELECT d.job_id FROM radix._downstream_of(j.job_id) d);
    IF cardinality(dropped) > 0 AND NOT cascade THEN
        RAISE EXCEPTION 'cannot drop job %.% because other jobs run after it', quote_ident(j.schema_name),
            quote_ident(j.job_name) USING ERRCODE = '2BP01',
            DETAIL = format('Jobs that run after it: %s.',
                            (SELECT string_agg(radix._job_name_for(caller, x), ', ' ORDER BY x.schema_name, x.job_name)
                             FROM radix.jobs x WHERE x.job_id = ANY (dropped))),
            HINT = 'Use DROP JOB ... CASCADE to drop them too.';
    END IF;
    FOR k IN SELECT x.* FROM radix.jobs x WHERE x.job_id = ANY (dropped) ORDER BY x.schema_name, x.job_name LOOP
        RAISE NOTICE 'drop cascades to %', radix._job_name_for(caller, k);
    END LOOP;
    dropped := dropped || j.job_id;
    uphill := ARRAY(SELECT e.upstream_id FROM radix.job_edges e WHERE e.job_id = ANY (dropped));
    DELETE FROM radix.job_edges e WHERE e.job_id = ANY (dropped);  -- before the jobs: the key checks in order
    DELETE FROM radix.jobs WHERE job_id = ANY (dropped);
    PERFORM radix._path_changed(u) FROM radix.jobs u WHERE u.job_id = ANY (uphill);
    PERFORM radix._hint('radix_jobs', d::text) FROM unnest(dropped) d;
    RETURN true;
END $$;

-- Apply normalised options (and RESET names) to a job row; time_zone applies to CRON schedules only.
CREATE OR REPLACE FUNCTION radix._with_options(j radix.jobs, opts jsonb, reset text[]) RETURNS radix.jobs
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    r text;
    hook jsonb;
BEGIN
    FOREACH r IN ARRAY coalesce(reset, '{}') LOOP
        CASE r
        WHEN 'timeout' THEN j.deadline_ms := 240000;
        WHEN 'max_attempts' THEN j.max_attempts := 5;
        WHEN 'history' THEN j.history_limit := 256;
        WHEN 'coalesce' THEN j.coalesce_ticks := true;
        WHEN 'batch' THEN j.batch_ticks := false;
        WHEN 'start_deadline' THEN j.start_deadline_ns := NULL;
        WHEN 'jitter' THEN j.jitter_ns := NULL;
        WHEN 'group' THEN j.group_id := NULL;
        WHEN 'on_failure' THEN j.on_failure_oid := NULL; j.on_failure_signature := NULL;
        WHEN 'time_zone' THEN
            IF j.schedule_kind = 'cron' THEN j.cron_time_zone := 'UTC'; END IF;
        ELSE
            RAISE EXCEPTION 'unknown option "%" (accepted: %)', r, radix._option_names()
                USING ERRCODE = '22023';
        END CASE;
    END LOOP;
    opts := coalesce(opts, '{}');
    j.deadline_ms := coalesce((opts->>'deadline_ms')::integer, j.deadline_ms);
    j.max_attempts := coalesce((opts->>'max_attempts')::integer, j.max_attempts);
    j.history_limit := coalesce((opts->>'history_limit')::integer, j.history_limit);
    j.coalesce_ticks := coalesce((opts->>'coalesce_ticks')::boolean, j.coalesce_ticks);
    j.batch_ticks := coalesce((opts->>'batch_ticks')::boolean, j.batch_ticks);
    j.start_deadline_ns := coalesce((opts->>'start_deadline_ns')::bigint, j.start_deadline_ns);
    j.jitter_ns := coalesce((opts->>'jitter_ns')::bigint, j.jitter_ns);
    IF opts ? 'group' THEN
        j.group_id := radix._group_for_job(j.owner_oid, opts->>'group');
    END IF;
    IF opts ? 'on_failure' THEN
        hook := radix._check_hook(opts->>'on_failure', opts->'on_failure_binding');
        j.on_failure_oid := (hook->>'oid')::oid;
        j.on_failure_signature := hook->>'signature';
    END IF;
    IF opts ? 'time_zone' THEN
        IF j.schedule_kind <> 'cron' THEN
            RAISE EXCEPTION 'option time_zone applies to CRON schedules only' USING ERRCODE = '22023';
        END IF;
        j.cron_time_zone := opts->>'time_zone';
    END IF;
    RETURN j;
END $$;

-- An EVERY job's jitter is less than its interval, so that its ticks stay in order (each due before the
-- next one's planned time); an AFTER job, whose ticks are its upstreams' (due at once, never missed), takes
-- neither jitter nor a start deadline.
CREATE OR REPLACE FUNCTION radix._check_jitter(j radix.jobs) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    IF j.schedule_kind = 'after' AND (j.jitter_ns IS NOT NULL OR j.start_deadline_ns IS NOT NULL) THEN
        RAISE EXCEPTION 'options jitter and start_deadline apply to a job''s own schedule: an AFTER job has none'
            USING ERRCODE = '22023';
    END IF;
    IF j.jitter_ns >= j.interval_ns THEN
        RAISE EXCEPTION 'option jitter must be less than the schedule''s interval (EVERY %)',
            make_interval(secs => j.interval_ns / 1e9) USING ERRCODE = '22023';
    END IF;
END $$;

-- A job row with a (normalised) schedule.
CREATE OR REPLACE FUNCTION radix._with_schedule(j radix.jobs, sched jsonb) RETURNS radix.jobs
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    j.schedule_kind := sched->>'kind';
    j.interval_ns := (sched->>'interval_ns')::bigint;
    j.starting_at_ns := (sched->>'starting_at_ns')::bigint;
    j.at_ns := (sched->>'at_ns')::bigint;
    j.cron_expression := sched->>'cron_expression';
    j.cron_time_zone := sched->>'cron_time_zone';
    RETURN j;
END $$;

-- The job named `job`, locked for a change (the wait bounded, one-line errors), and its owner checked
-- against `caller`. A running atomic attempt does not hold the lock this takes (NO KEY UPDATE).
CREATE OR REPLACE FUNCTION radix._job_for_change(caller oid, job text) RETURNS radix.jobs
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    prior_timeout text := radix._bound_lock_wait();
    j radix.jobs;
BEGIN
    BEGIN
        j := radix._find_job(job);
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'job % is being changed by another transaction; try again', job USING ERRCODE = '55P03';
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    IF j.job_id IS NULL THEN
        RAISE EXCEPTION 'job % does not exist', job USING ERRCODE = '42704';
    END IF;
    PERFORM radix._check_job_owner(j, caller);
    RETURN j;
END $$;

-- (Re)arm a job's state from its row (a new definition version): the next tick from its schedule (an AFTER
-- job has none: it is scheduled with no due time, and runs the ticks its upstreams queue).
-- `keep_anchor` keeps an EVERY job's grid anchor (ALTER ... SET, CREATE OR
-- REPLACE) unless STARTING AT gives one; a completed one-time job stays complete only for the same AT
-- time; DISABLE drops the queued requests but the on_failure hooks owed, any other re-arm puts a request in
-- flight back in the queue; a job without an on_failure procedure owes no hook.
CREATE OR REPLACE FUNCTION radix._rearm(j radix.jobs, keep_anchor boolean) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    old radix.radix_system_job_state;
    anchor bigint;
    planned bigint;
    done boolean := false;
    new_status text := CASE WHEN j.enabled THEN 'scheduled' ELSE 'disabled' END;
BEGIN
    SELECT * INTO old FROM radix.radix_system_job_state WHERE job_id = j.job_id;
    anchor := coalesce(j.starting_at_ns, CASE WHEN keep_anchor THEN old.anchor_ns END, now_ns);
    IF j.schedule_kind = 'every' THEN
        -- the first grid point after now, as schedule.initial_planned: STARTING AT itself while it is
        -- ahead; any other anchor is the grid's origin, not a tick
        planned := CASE WHEN j.starting_at_ns IS NOT NULL AND anchor > now_ns THEN anchor
                        ELSE anchor + j.interval_ns * (greatest(now_ns - anchor, 0) / j.interval_ns + 1) END;
    ELSIF j.schedule_kind = 'at' THEN
        planned := j.at_ns;
        done := (coalesce(old.stash->>'status', old.status) = 'complete'
                 AND coalesce((old.stash->>'planned_ns')::bigint, old.planned_ns) = j.at_ns)
             OR EXISTS (SELECT 1 FROM radix.radix_system_job_history h
                        WHERE h.job_id = j.job_id AND h.planned_ns = j.at_ns AND h.status = 'succeeded'
                          AND h.run_kind = 'schedule');
        IF done THEN
            new_status := 'complete';
        END IF;
    END IF;
    IF NOT j.enabled THEN  -- a hook owed is kept (radix._failed_for_good): it runs for a disabled job too
        DELETE FROM radix.job_requests WHERE job_id = j.job_id AND kind <> 'on_failure';
    END IF;
    IF old.request_kind IS NOT NULL AND (j.enabled OR old.request_kind = 'on_failure') THEN
        INSERT INTO radix.job_requests (job_id, planned_ns, kind, requested_by, detail)
        VALUES (j.job_id, old.planned_ns, old.request_kind, j.owner_name, old.request_detail) ON CONFLICT DO NOTHING;
    END IF;
    IF j.on_failure_oid IS NULL THEN
        DELETE FROM radix.job_requests WHERE job_id = j.job_id AND kind = 'on_failure';
    END IF;
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
        error = radix._lease_lost(jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = j.job_id AND h.status = 'running';
    UPDATE radix.radix_system_job_state SET
        definition_version = j.definition_version, status = new_status,
        anchor_ns = anchor, planned_ns = planned,
        due_ns = CASE WHEN new_status = 'scheduled' AND j.schedule_kind <> 'after'
                      THEN coalesce(planned + radix._jitter_ns(j.job_id, planned, j.jitter_ns), now_ns) END,
        attempt = 0,
        idempotency_key = CASE WHEN done THEN j.job_id::text || '/' || j.at_ns::text END,
        lease_node = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = CASE WHEN done THEN last_error END,
        request_kind = NULL, stash = NULL, request_detail = NULL,
        fence_node = CASE WHEN old.status = 'running' THEN old.lease_node ELSE old.fence_node END,
        fence_token = CASE WHEN old.status = 'running' THEN old.lease_token ELSE old.fence_token END,
        updated_at = clock_timestamp()
    WHERE job_id = j.job_id;
    IF NOT FOUND THEN
        INSERT INTO radix.radix_system_job_state
            (job_id, definition_version, status, anchor_ns, planned_ns, due_ns, attempt)
        VALUES (j.job_id, j.definition_version, new_status, anchor, planned,
                CASE WHEN new_status = 'scheduled' AND j.schedule_kind <> 'after'
                     THEN coalesce(planned + radix._jitter_ns(j.job_id, planned, j.jitter_ns), now_ns) END, 0);
    END IF;
    PERFORM radix._promote_request(j.job_id);
    PERFORM radix._hint('radix_jobs', j.job_id::text);
END $$;

CREATE OR REPLACE FUNCTION radix._arm_state(j radix.jobs) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
BEGIN ATOMIC
    SELECT radix._rearm(j, false);
END;

-- Change a job: each argument that is not NULL is a change, admitted as CREATE JOB admits it (a new
-- principal: the SET rule for the caller and the owner; a new call: `binding`, resolved on the caller's
-- side, checked against the catalog; a new name: CREATE on its schema). Options: `reset` names go back to
-- their defaults, then the schedule is set, then `opts` (normalised) apply. Returns false when nothing
-- changed; otherwise definition_version is bumped, and the state re-armed unless only the name, history,
-- max_attempts, batch, start deadline, group, on_failure or upstreams changed (a tick found before such a
-- change still runs; radix.start_ticks reads batch again when it starts a batch).
CREATE OR REPLACE FUNCTION radix._change_job(creator name, job text, enabled boolean, schedule jsonb, run_as text,
                                  procedure text, binding jsonb, opts jsonb, reset text[], rename_to text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    caller oid := radix._caller(creator);
    j radix.jobs := radix._job_for_change(caller, job);
    prior_timeout text;
    n radix.jobs;
    parts text[];
    principal pg_roles;
    bound jsonb;
    sched jsonb;
    edges_changed boolean := false;
    quiet boolean;
BEGIN
    n := radix._with_options(j, NULL, reset);
    IF rename_to IS NOT NULL THEN
        parts := radix._split_qualified(rename_to, 'job');
        IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = parts[1]) THEN
            RAISE EXCEPTION 'schema % does not exist', quote_ident(parts[1]) USING ERRCODE = '3F000';
        END IF;
        IF NOT has_schema_privilege(caller, (SELECT oid FROM pg_namespace WHERE nspname = parts[1]), 'CREATE') THEN
            RAISE EXCEPTION 'permission denied for schema %', quote_ident(parts[1]) USING ERRCODE = '42501',
                HINT = 'Renaming a job needs the CREATE privilege on its new schema.';
        END IF;
        PERFORM radix._lock_name('job', quote_ident(parts[1]) || '.' || quote_ident(parts[2]));
        IF EXISTS (SELECT 1 FROM radix.jobs x WHERE x.schema_name = parts[1] AND x.job_name = parts[2]
                   AND x.job_id <> j.job_id) THEN
            RAISE EXCEPTION 'job %.% already exists', quote_ident(parts[1]), quote_ident(parts[2])
                USING ERRCODE = '42710';
        END IF;
        n.schema_name := parts[1];
        n.job_name := parts[2];
    END IF;
    IF schedule IS NOT NULL THEN
        IF schedule ? 'time_zone' AND opts ? 'time_zone' THEN
            RAISE EXCEPTION 'the time zone is given twice (TIME ZONE and time_zone)' USING ERRCODE = '22023';
        END IF;
        sched := radix._normalise_schedule(schedule);
        n := radix._with_schedule(n, sched);
        edges_changed := radix._set_edges(n, sched->'after', caller);
    END IF;
    n := radix._with_options(n, opts, NULL);
    IF run_as IS NOT NULL THEN
        principal := radix._check_principal(caller, j.owner_oid, run_as);
        n.principal_oid := principal.oid;
        n.principal_name := principal.rolname;
    END IF;
    IF binding IS NOT NULL THEN
        parts := radix._split_qualified(procedure, 'procedure');
        bound := radix._check_binding(parts[1], parts[2], binding);
        n.procedure_oid := (bound->>'procedure_oid')::oid;
        n.procedure_signature := bound->>'signature';
        n.arguments := bound->'arguments';
        n.non_atomic := false;  -- detected again by the new procedure's first attempt
    END IF;
    IF enabled IS NOT NULL THEN
        n.enabled := enabled;
    END IF;
    IF n IS NOT DISTINCT FROM j AND NOT edges_changed THEN
        RETURN false;
    END IF;
    PERFORM radix._check_jitter(n);
    quiet := (edges_changed
              OR (n.schema_name, n.job_name, n.history_limit, n.max_attempts, n.batch_ticks, n.start_deadline_ns,
                  n.group_id, n.on_failure_oid, n.on_failure_signature)
                 IS DISTINCT FROM
                 (j.schema_name, j.job_name, j.history_limit, j.max_attempts, j.batch_ticks, j.start_deadline_ns,
                  j.group_id, j.on_failure_oid, j.on_failure_signature))
         AND (n.principal_oid, n.procedure_oid, n.procedure_signature, n.arguments, n.schedule_kind, n.interval_ns,
              n.starting_at_ns, n.at_ns, n.cron_expression, n.cron_time_zone, n.enabled, n.deadline_ms,
              n.coalesce_ticks, n.jitter_ns)
             IS NOT DISTINCT FROM
             (j.principal_oid, j.procedure_oid, j.procedure_signature, j.arguments, j.schedule_kind, j.interval_ns,
              j.starting_at_ns, j.at_ns, j.cron_expression, j.cron_time_zone, j.enabled, j.deadline_ms,
              j.coalesce_ticks, j.jitter_ns);
    prior_timeout := radix._bound_lock_wait();
    BEGIN
        UPDATE radix.jobs SET schema_name = n.schema_name, job_name = n.job_name,
            principal_oid = n.principal_oid, principal_name = n.principal_name,
            procedure_oid = n.procedure_oid, procedure_signature = n.procedure_signature, arguments = n.arguments,
            schedule_kind = n.schedule_kind, interval_ns = n.interval_ns, starting_at_ns = n.starting_at_ns,
            at_ns = n.at_ns, cron_expression = n.cron_expression, cron_time_zone = n.cron_time_zone,
            enabled = n.enabled, deadline_ms = n.deadline_ms, max_attempts = n.max_attempts,
            history_limit = n.history_limit, coalesce_ticks = n.coalesce_ticks, batch_ticks = n.batch_ticks,
            start_deadline_ns = n.start_deadline_ns, jitter_ns = n.jitter_ns, non_atomic = n.non_atomic,
            group_id = n.group_id, on_failure_oid = n.on_failure_oid, on_failure_signature = n.on_failure_signature,
            definition_version = j.definition_version + 1
        WHERE job_id = j.job_id RETURNING * INTO n;
    EXCEPTION WHEN lock_not_available THEN
        -- a new name changes a key column: that waits for a running atomic attempt (its KEY SHARE lock)
        RAISE EXCEPTION 'job % is running an attempt that holds it; try again when it ends', job
            USING ERRCODE = '55P03';
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    IF quiet THEN
        UPDATE radix.radix_system_job_state SET definition_version = n.definition_version WHERE job_id = n.job_id;
        IF n.on_failure_oid IS NULL THEN  -- RESET (on_failure): the hooks still queued are owed no more
            DELETE FROM radix.job_requests WHERE job_id = n.job_id AND kind = 'on_failure';
        END IF;
    ELSE
        PERFORM radix._rearm(n, j.enabled AND n.enabled
                                AND n.starting_at_ns IS NOT DISTINCT FROM j.starting_at_ns);
    END IF;
    PERFORM radix._hint('radix_jobs', n.job_id::text);
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION radix.alter_job(job text, enabled boolean DEFAULT NULL, schedule jsonb DEFAULT NULL,
                                run_as text DEFAULT NULL, procedure text DEFAULT NULL,
                                arguments jsonb DEFAULT NULL, options jsonb DEFAULT NULL,
                                reset text[] DEFAULT NULL, rename_to text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    args jsonb := radix._normalise_arguments(coalesce(arguments, '[]'));
    proc_parts text[];
BEGIN
    IF arguments IS NOT NULL AND procedure IS NULL THEN
        RAISE EXCEPTION 'arguments are changed with the procedure (SET CALL)' USING ERRCODE = '22023';
    END IF;
    IF args IS NULL THEN
        RAISE EXCEPTION 'arguments must be a JSON array or object' USING ERRCODE = '22023';
    END IF;
    IF procedure IS NOT NULL THEN
        proc_parts := radix._split_qualified(procedure, 'procedure');
    END IF;
    RETURN radix._change_job(current_user, job, enabled, schedule, run_as, procedure,
                             CASE WHEN procedure IS NOT NULL
                                  THEN radix._resolve_call(proc_parts[1], proc_parts[2], args) END,
                             radix._resolve_hook(radix._normalise_options(options)), reset, rename_to);
END $$;

CREATE OR REPLACE FUNCTION radix._create_job(creator name, job text, schedule jsonb, run_as text, procedure text,
                                  binding jsonb, enabled boolean, if_not_exists boolean, opts jsonb)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    caller oid := radix._caller(creator);
    job_parts text[] := radix._split_qualified(job, 'job');
    proc_parts text[] := radix._split_qualified(procedure, 'procedure');
    existing uuid := radix._check_admission(caller, job_parts, run_as, if_not_exists);
    principal pg_roles;
    bound jsonb;
    sched jsonb;
    j radix.jobs;
BEGIN
    IF existing IS NOT NULL THEN
        RETURN existing;
    END IF;
    IF schedule ? 'time_zone' AND opts ? 'time_zone' THEN
        RAISE EXCEPTION 'the time zone is given twice (TIME ZONE and time_zone)' USING ERRCODE = '22023';
    END IF;
    principal := radix._check_principal(caller, caller, run_as);
    bound := radix._check_binding(proc_parts[1], proc_parts[2], binding);
    j.owner_oid := caller;  -- the owner a group joined is checked against
    sched := radix._normalise_schedule(schedule);
    j := radix._with_options(radix._with_schedule(j, sched), opts, NULL);
    PERFORM radix._check_jitter(j);
    INSERT INTO radix.jobs (schema_name, job_name, owner_oid, owner_name, principal_oid, principal_name,
                            procedure_oid, procedure_signature, arguments, schedule_kind, interval_ns,
                            starting_at_ns, at_ns, cron_expression, cron_time_zone, enabled, deadline_ms,
                            max_attempts, history_limit, coalesce_ticks, batch_ticks, start_deadline_ns,
                            jitter_ns, group_id, on_failure_oid, on_failure_signature)
    VALUES (job_parts[1], job_parts[2], caller, (SELECT rolname FROM pg_roles WHERE oid = caller),
            principal.oid, principal.rolname, (bound->>'procedure_oid')::oid, bound->>'signature',
            bound->'arguments', j.schedule_kind, j.interval_ns, j.starting_at_ns, j.at_ns, j.cron_expression,
            j.cron_time_zone, coalesce(enabled, true), coalesce(j.deadline_ms, 240000),
            coalesce(j.max_attempts, 5), coalesce(j.history_limit, 256), coalesce(j.coalesce_ticks, true),
            coalesce(j.batch_ticks, false), j.start_deadline_ns, j.jitter_ns, j.group_id, j.on_failure_oid,
            j.on_failure_signature)
    RETURNING * INTO j;
    PERFORM radix._set_edges(j, sched->'after', caller);
    PERFORM radix._rearm(j, false);
    RETURN j.job_id;
END $$;

CREATE OR REPLACE FUNCTION radix.create_job(job text, schedule jsonb, run_as text, procedure text,
                                 arguments jsonb DEFAULT '[]', enabled boolean DEFAULT true,
                                 if_not_exists boolean DEFAULT false, deadline_ms integer DEFAULT 240000,
                                 timeout interval DEFAULT NULL, options jsonb DEFAULT NULL,
                                 or_replace boolean DEFAULT false)
RETURNS uuid LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    args jsonb := radix._normalise_arguments(arguments);
    proc_parts text[] := radix._split_qualified(procedure, 'procedure');
    opts jsonb;
    existing uuid;
BEGIN
    IF args IS NULL THEN
        RAISE EXCEPTION 'arguments must be a JSON array or object' USING ERRCODE = '22023';
    END IF;
    IF or_replace AND if_not_exists THEN
        RAISE EXCEPTION 'CREATE OR REPLACE JOB cannot take IF NOT EXISTS' USING ERRCODE = '42601';
    END IF;
    opts := radix._resolve_hook(radix._normalise_options(options));
    IF timeout IS NOT NULL THEN
        opts := opts || radix._normalise_options(jsonb_build_object('timeout', timeout::text));
    ELSIF NOT opts ? 'deadline_ms' AND deadline_ms IS NOT NULL THEN
        opts := opts || jsonb_build_object('deadline_ms', radix._check_timeout(deadline_ms, deadline_ms::text || ' ms'));
    END IF;
    IF or_replace AND radix._job_exists(job) THEN
        PERFORM radix._change_job(current_user, job, coalesce(enabled, true), schedule, run_as, procedure,
                                  radix._resolve_call(proc_parts[1], proc_parts[2], args), opts,
                                  string_to_array(radix._option_names(), ', '), NULL);
        RETURN (SELECT o.job_id FROM radix.job_overview o, radix._split_qualified(job, 'job') AS p(parts)
                WHERE o.schema_name = p.parts[1] AND o.job_name = p.parts[2]);
    END IF;
    existing := radix._admit(current_user, job, run_as, if_not_exists);
    IF existing IS NOT NULL THEN
        RETURN existing;
    END IF;
    RETURN radix._create_job(current_user, job, schedule, run_as, procedure,
                             radix._resolve_call(proc_parts[1], proc_parts[2], args), enabled,
                             if_not_exists, opts);
END $$;

-- What the two ON DELETE CASCADE did: a dropped job's history and frames go with it.
CREATE OR REPLACE FUNCTION radix._job_dropped() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    DELETE FROM radix.radix_system_job_history h WHERE h.job_id = OLD.job_id;
    DELETE FROM radix.attempt_frames f WHERE f.job_id = OLD.job_id;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER job_dropped AFTER DELETE ON radix.jobs
    FOR EACH ROW EXECUTE FUNCTION radix._job_dropped();

CREATE OR REPLACE FUNCTION radix._job_tick_lock() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    INSERT INTO radix.tick_locks (job_id) VALUES (NEW.job_id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER job_tick_lock AFTER INSERT ON radix.jobs
    FOR EACH ROW EXECUTE FUNCTION radix._job_tick_lock();

CREATE OR REPLACE FUNCTION radix._job_path_changed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    PERFORM radix._path_changed(NEW);
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER job_path_changed AFTER UPDATE OF non_atomic, schedule_kind, group_id ON radix.jobs
    FOR EACH ROW EXECUTE FUNCTION radix._job_path_changed();
