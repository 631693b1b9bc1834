-- 0011: change a job without losing it (issue #13): RUN JOB, backfill, ALTER JOB ... SET / RESET /
-- RENAME, CREATE OR REPLACE JOB, and the options max_attempts, history, coalesce and time_zone.
--
-- Requests. RUN JOB and RUN JOB ... FOR RANGE queue extra ticks in radix.job_requests, each with its own
-- planned time (RUN JOB: the moment of the request; a backfill: a tick of the schedule) and therefore its
-- own idempotency key. A request becomes the job's current tick only while the job is idle (its state
-- neither running nor waiting to retry): the regular state is stashed in the state row
-- (radix_system_job_state.stash), the request's tick is installed with request_kind set, and when its
-- attempts end (success, or a terminal failure) the stash is put back and the next request, if any, is
-- installed. So a request never overlaps an attempt of the same job: it waits its turn, and it is
-- claimed, run, retried, fenced and recorded exactly as a scheduled tick is (the claim never coalesces a
-- request's tick). Requests run on a disabled job too. ALTER JOB ... DISABLE drops every queued request
-- (it stops a backfill); any other re-arm puts the request in flight back in the queue.
--
-- Backfill ticks that succeeded are recorded in radix.backfill_done in the attempt's own transaction
-- (atomic jobs: with the procedure's effects), so a repeated backfill skips them even after their
-- history rows were pruned; scheduled ticks count as done while their succeeded history row is kept.
--
-- Re-arming. A change of schedule, principal, call, timeout, coalesce or time zone (ALTER JOB ... SET,
-- CREATE OR REPLACE JOB, ENABLE/DISABLE) re-arms the state as ENABLE did: an attempt running under the
-- old definition is fenced out (its lease token is gone: an atomic attempt rolls back, a non-atomic one
-- keeps what it committed and is ended at its node's next lease renewal), and the next attempt cannot
-- start until its backend has ended (the claim skips a job with a live frame or a locked row). An EVERY
-- job keeps its grid anchor unless its STARTING AT changes. RENAME and SET (history | max_attempts)
-- change nothing about how an attempt runs: they bump definition_version and leave a running attempt be.
--
-- Fence. An atomic attempt's frame is not visible to other transactions before it commits, and the row
-- lock it holds is on the state row's old version once a re-arm updated it; so a re-arm records the
-- fenced attempt (fence_node, fence_token) and the claim skips the job while that node is alive, until
-- the node reports the attempt's end (radix.finish_attempt with the old token clears the fence).

-- -- storage -------------------------------------------------------------------------------------------

ALTER TABLE radix.jobs
    ADD COLUMN max_attempts integer NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 10),
    ADD COLUMN history_limit integer NOT NULL DEFAULT 256 CHECK (history_limit BETWEEN 1 AND 100000),
    ADD COLUMN coalesce_ticks boolean NOT NULL DEFAULT true;

ALTER TABLE radix.radix_system_job_state
    ADD COLUMN request_kind text CHECK (request_kind IN ('run', 'backfill')),
    ADD COLUMN stash jsonb,
    ADD COLUMN fence_node text,
    ADD COLUMN fence_token uuid,
    ADD CHECK ((request_kind IS NULL) = (stash IS NULL));

ALTER TABLE radix.radix_system_job_history
    ADD COLUMN run_kind text NOT NULL DEFAULT 'schedule' CHECK (run_kind IN ('schedule', 'run', 'backfill'));

CREATE TABLE radix.job_requests (
    job_id       uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    planned_ns   bigint NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('run', 'backfill')),
    requested_by name NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, planned_ns)
);

CREATE TABLE radix.backfill_done (
    job_id     uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    planned_ns bigint NOT NULL,
    PRIMARY KEY (job_id, planned_ns)
);
REVOKE ALL ON radix.job_requests, radix.backfill_done FROM PUBLIC;

-- -- limits --------------------------------------------------------------------------------------------

CREATE FUNCTION radix.max_requested_ticks() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 10000;
COMMENT ON FUNCTION radix.max_requested_ticks() IS
    'radixjobs: the most ticks one RUN JOB ... FOR RANGE may queue, and the most requests a job may have queued';
CREATE FUNCTION radix.max_missed_ticks() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1000;
COMMENT ON FUNCTION radix.max_missed_ticks() IS
    'radixjobs: with coalesce = off, at most this many missed ticks of a job are run (the newest ones)';
GRANT EXECUTE ON FUNCTION radix.max_requested_ticks(), radix.max_missed_ticks() TO PUBLIC;

-- -- options -------------------------------------------------------------------------------------------

-- WITH (...) / SET (...) options as given (JSON: {"timeout": "2 hours", "max_attempts": 3, "history":
-- 1000, "coalesce": "off", "time_zone": "Europe/Berlin"}) -> their stored form {deadline_ms, max_attempts,
-- history_limit, coalesce_ticks, time_zone}; raises naming the option for anything else. Runs on the
-- caller's side (an interval is read in the caller's session, like a constant).
CREATE FUNCTION radix._normalise_options(opts jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k text;
    v jsonb;
    t text;
    out jsonb := '{}';
    iv interval;
    n numeric;
    top integer;
BEGIN
    IF opts IS NULL THEN
        RETURN out;
    END IF;
    IF jsonb_typeof(opts) <> 'object' THEN
        RAISE EXCEPTION 'options must be a JSON object' USING ERRCODE = '22023';
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(opts) LOOP
        t := CASE jsonb_typeof(v) WHEN 'string' THEN v #>> '{}' WHEN 'number' THEN v::text
                                  WHEN 'boolean' THEN v::text END;
        IF t IS NULL THEN
            RAISE EXCEPTION 'option % needs a value', k USING ERRCODE = '22023';
        END IF;
        CASE k
        WHEN 'timeout' THEN
            BEGIN
                iv := CASE WHEN jsonb_typeof(v) = 'number' THEN make_interval(secs => t::float8 / 1000)
                           ELSE t::interval END;
            EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow
                           OR invalid_text_representation THEN
                RAISE EXCEPTION 'option timeout: invalid interval %', quote_literal(t) USING ERRCODE = '22023';
            END;
            IF extract(month FROM iv) <> 0 OR extract(year FROM iv) <> 0 THEN
                RAISE EXCEPTION 'calendar units (month, year) are not allowed in a timeout' USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object('deadline_ms',
                radix._check_timeout(extract(epoch FROM iv) * 1000, quote_literal(t)));
        WHEN 'max_attempts', 'history' THEN
            BEGIN
                n := t::numeric;
            EXCEPTION WHEN invalid_text_representation THEN
                n := NULL;
            END;
            top := CASE k WHEN 'history' THEN 100000 ELSE 10 END;  -- (a CASE in an IF would end at THEN)
            IF n IS NULL OR n <> trunc(n) OR n < 1 OR n > top THEN
                RAISE EXCEPTION 'option % must be an integer from 1 to %, not %', k, top, t USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object(CASE k WHEN 'history' THEN 'history_limit' ELSE k END, n::integer);
        WHEN 'coalesce' THEN
            IF lower(t) NOT IN ('on', 'off', 'true', 'false', 'yes', 'no', '1', '0') THEN
                RAISE EXCEPTION 'option coalesce must be on or off, not %', t USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object('coalesce_ticks', lower(t) IN ('on', 'true', 'yes', '1'));
        WHEN 'time_zone' THEN
            IF NOT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = t) THEN
                RAISE EXCEPTION 'option time_zone: unknown time zone %', quote_literal(t) USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object('time_zone', t);
        ELSE
            RAISE EXCEPTION 'unknown option "%" (accepted: timeout, max_attempts, history, coalesce, time_zone)', k
                USING ERRCODE = '22023';
        END CASE;
    END LOOP;
    RETURN out;
END $$;
GRANT EXECUTE ON FUNCTION radix._normalise_options(jsonb) TO PUBLIC;

-- Apply normalised options (and RESET names) to a job row; time_zone applies to CRON schedules only.
CREATE FUNCTION radix._with_options(j radix.jobs, opts jsonb, reset text[]) RETURNS radix.jobs
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY coalesce(reset, '{}') LOOP
        CASE r
        WHEN 'timeout' THEN j.deadline_ms := 240000;
        WHEN 'max_attempts' THEN j.max_attempts := 5;
        WHEN 'history' THEN j.history_limit := 256;
        WHEN 'coalesce' THEN j.coalesce_ticks := true;
        WHEN 'time_zone' THEN
            IF j.schedule_kind = 'cron' THEN j.cron_time_zone := 'UTC'; END IF;
        ELSE
            RAISE EXCEPTION 'unknown option "%" (accepted: timeout, max_attempts, history, coalesce, time_zone)', r
                USING ERRCODE = '22023';
        END CASE;
    END LOOP;
    opts := coalesce(opts, '{}');
    j.deadline_ms := coalesce((opts->>'deadline_ms')::integer, j.deadline_ms);
    j.max_attempts := coalesce((opts->>'max_attempts')::integer, j.max_attempts);
    j.history_limit := coalesce((opts->>'history_limit')::integer, j.history_limit);
    j.coalesce_ticks := coalesce((opts->>'coalesce_ticks')::boolean, j.coalesce_ticks);
    IF opts ? 'time_zone' THEN
        IF j.schedule_kind <> 'cron' THEN
            RAISE EXCEPTION 'option time_zone applies to CRON schedules only' USING ERRCODE = '22023';
        END IF;
        j.cron_time_zone := opts->>'time_zone';
    END IF;
    RETURN j;
END $$;

-- A job row with a (normalised) schedule.
CREATE FUNCTION radix._with_schedule(j radix.jobs, sched jsonb) RETURNS radix.jobs
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
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

-- The principal checks of CREATE JOB, for a principal named at ALTER / REPLACE: it exists, `caller` and
-- the job's owner may act as it (the SET rule), it can log in and use PL/pgSQL.
CREATE FUNCTION radix._check_principal(caller oid, owner oid, run_as text) RETURNS pg_roles
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    principal pg_roles;
BEGIN
    SELECT * INTO principal FROM pg_roles WHERE rolname = run_as;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role % does not exist', quote_ident(run_as) USING ERRCODE = '42704';
    END IF;
    IF NOT radix.may_act_as(caller, principal.oid) OR NOT radix.may_act_as(owner, principal.oid) THEN
        RAISE EXCEPTION 'permission denied to schedule a job as role %', quote_ident(run_as)
            USING ERRCODE = '42501',
                  HINT = 'The caller and the job''s owner must be able to SET ROLE to the principal '
                         '(GRANT ... WITH SET TRUE); only superusers may name a superuser.';
    END IF;
    IF NOT principal.rolcanlogin THEN
        RAISE EXCEPTION 'role % cannot log in', quote_ident(run_as) USING ERRCODE = '42501',
            HINT = format('Jobs run on a connection logged in as their principal: ALTER ROLE %s LOGIN.',
                          quote_ident(run_as));
    END IF;
    IF NOT has_language_privilege(principal.oid, 'plpgsql', 'USAGE') THEN
        RAISE EXCEPTION 'role % cannot use PL/pgSQL, which runs its jobs', quote_ident(run_as)
            USING ERRCODE = '42501', HINT = format('GRANT USAGE ON LANGUAGE plpgsql TO %s', quote_ident(run_as));
    END IF;
    RETURN principal;
END $$;

-- The job named `job`, locked for a change (the wait bounded, one-line errors), and its owner checked
-- against `caller`. A running atomic attempt does not hold the lock this takes (NO KEY UPDATE).
CREATE FUNCTION radix._job_for_change(caller oid, job text) RETURNS radix.jobs
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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

-- -- requests ------------------------------------------------------------------------------------------

-- Install the oldest queued request as the job's current tick when the job is idle; true when it did.
CREATE FUNCTION radix._promote_request(job uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s radix.radix_system_job_state;
    r radix.job_requests;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = job) THEN
        RETURN false;
    END IF;
    SELECT * INTO s FROM radix.radix_system_job_state WHERE job_id = job;
    IF NOT FOUND OR s.status IN ('running', 'retry_wait') OR s.request_kind IS NOT NULL THEN
        RETURN false;
    END IF;
    DELETE FROM radix.job_requests q
    WHERE (q.job_id, q.planned_ns) = (SELECT o.job_id, o.planned_ns FROM radix.job_requests o
                                      WHERE o.job_id = job ORDER BY o.planned_ns LIMIT 1)
    RETURNING * INTO r;
    UPDATE radix.radix_system_job_state SET
        stash = jsonb_build_object('status', s.status, 'planned_ns', s.planned_ns, 'due_ns', s.due_ns,
                                   'attempt', s.attempt, 'idempotency_key', s.idempotency_key,
                                   'last_error', s.last_error),
        request_kind = r.kind, status = 'scheduled', planned_ns = r.planned_ns,
        due_ns = radix.to_ns(clock_timestamp()), attempt = 0, idempotency_key = NULL,
        updated_at = clock_timestamp()
    WHERE job_id = job;
    PERFORM radix._hint('radix_jobs', job::text);
    RETURN true;
END $$;

-- As 0003, and a request's tick ends by putting the stashed regular state back (a backfill tick that
-- succeeded is recorded in radix.backfill_done first); then the next queued request, if any, is installed.
CREATE OR REPLACE FUNCTION radix._advance(job uuid, token uuid, next_planned_ns bigint, succeeded boolean,
                                          error jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind text := (SELECT schedule_kind FROM radix.jobs WHERE job_id = job);
    s radix.radix_system_job_state;
BEGIN
    SELECT * INTO s FROM radix.radix_system_job_state
    WHERE job_id = job AND lease_token = token AND status = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF s.request_kind IS NOT NULL THEN
        IF succeeded AND s.request_kind = 'backfill' THEN
            INSERT INTO radix.backfill_done (job_id, planned_ns) VALUES (job, s.planned_ns) ON CONFLICT DO NOTHING;
        END IF;
        UPDATE radix.radix_system_job_state SET
            status = s.stash->>'status', planned_ns = (s.stash->>'planned_ns')::bigint,
            due_ns = (s.stash->>'due_ns')::bigint, attempt = (s.stash->>'attempt')::integer,
            idempotency_key = s.stash->>'idempotency_key',
            last_error = CASE WHEN succeeded THEN s.stash->'last_error' ELSE coalesce(error, s.last_error) END,
            request_kind = NULL, stash = NULL,
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = clock_timestamp()
        WHERE job_id = job AND lease_token = token AND status = 'running';
    ELSE
        UPDATE radix.radix_system_job_state SET
            status = CASE WHEN kind = 'at' OR next_planned_ns IS NULL
                          THEN CASE WHEN succeeded THEN 'complete' ELSE 'failed' END
                          ELSE 'scheduled' END,
            planned_ns = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN planned_ns ELSE next_planned_ns END,
            due_ns = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN NULL ELSE next_planned_ns END,
            attempt = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN attempt ELSE 0 END,
            idempotency_key = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN idempotency_key END,
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL,
            last_error = coalesce(error, CASE WHEN succeeded THEN NULL ELSE last_error END),
            updated_at = clock_timestamp()
        WHERE job_id = job AND lease_token = token AND status = 'running';
    END IF;
    IF NOT FOUND THEN  -- re-armed or taken over since the read above (the token is the fence)
        RETURN false;
    END IF;
    PERFORM radix._promote_request(job);
    RETURN true;
END $$;

-- RUN JOB / RUN JOB ... FOR RANGE: queue `ticks` (planned times, ns) as requests of `kind`; the same
-- rights as ALTER JOB. Ticks already queued, the job's current tick (which will run anyway), or done (a
-- succeeded attempt in the history, or a backfill tick recorded done) are skipped. Returns the ticks queued.
CREATE FUNCTION radix._request_ticks(creator name, job text, ticks bigint[], kind text) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    j radix.jobs := radix._job_for_change(caller, job);
    s radix.radix_system_job_state;
    queued bigint[];
BEGIN
    IF cardinality(ticks) > radix.max_requested_ticks() THEN
        RAISE EXCEPTION 'RUN JOB would queue % ticks, above the limit of % per statement', cardinality(ticks),
            radix.max_requested_ticks() USING ERRCODE = '54000', HINT = 'Split the range.';
    END IF;
    SELECT * INTO s FROM radix.radix_system_job_state WHERE job_id = j.job_id;
    queued := ARRAY(
        SELECT DISTINCT t FROM unnest(ticks) AS t
        WHERE t IS NOT NULL
          -- the job's current tick (scheduled, running or retrying, a request's or the stashed regular one)
          AND NOT coalesce(s.status IN ('scheduled', 'running', 'retry_wait') AND s.planned_ns = t, false)
          AND NOT coalesce(s.stash->>'status' IN ('scheduled', 'running', 'retry_wait')
                           AND (s.stash->>'planned_ns')::bigint = t, false)
          AND NOT EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = j.job_id AND q.planned_ns = t)
          AND NOT (kind = 'backfill' AND (
                   EXISTS (SELECT 1 FROM radix.backfill_done d WHERE d.job_id = j.job_id AND d.planned_ns = t)
                   OR EXISTS (SELECT 1 FROM radix.radix_system_job_history h
                              WHERE h.job_id = j.job_id AND h.planned_ns = t AND h.status = 'succeeded')))
        ORDER BY t);
    IF (SELECT count(*) FROM radix.job_requests q WHERE q.job_id = j.job_id) + cardinality(queued)
       > radix.max_requested_ticks() THEN
        RAISE EXCEPTION 'job % has too many queued runs (at most %)', job, radix.max_requested_ticks()
            USING ERRCODE = '54000', HINT = 'Wait for them to run, or ALTER JOB ... DISABLE to drop them.';
    END IF;
    INSERT INTO radix.job_requests (job_id, planned_ns, kind, requested_by)
    SELECT j.job_id, t, kind, (SELECT rolname FROM pg_roles WHERE oid = caller) FROM unnest(queued) AS t;
    PERFORM radix._promote_request(j.job_id);
    RETURN queued;
END $$;

-- RUN JOB name: one extra attempt now; returns its idempotency key (<job-id>/<planned-ns>).
CREATE FUNCTION radix.run_job(job text) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    parts text[] := radix._split_qualified(job, 'job');
    queued bigint[] := radix._request_ticks(current_user, job, ARRAY[radix.to_ns(clock_timestamp())], 'run');
BEGIN
    IF cardinality(queued) = 0 THEN  -- the same nanosecond twice
        RAISE EXCEPTION 'a run of job % was just requested; try again', job USING ERRCODE = '55006';
    END IF;
    RETURN (SELECT o.job_id FROM radix.job_overview o
            WHERE o.schema_name = parts[1] AND o.job_name = parts[2])::text || '/' || queued[1]::text;
END $$;

-- RUN JOB name FOR RANGE a TO b: every tick of the schedule in [a, b), and not after now, that has not
-- succeeded. EVERY and AT ticks are computed here; the database cannot evaluate cron, so for a CRON job
-- the caller passes the ticks (radixjobs computes them with the scheduler's own cron code) and they are
-- checked to lie in the range. Returns how many ticks were queued.
CREATE FUNCTION radix.backfill_job(job text, from_time timestamptz, to_time timestamptz,
                                   cron_ticks bigint[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a bigint := radix.to_ns(from_time);
    b bigint := least(radix.to_ns(to_time), radix.to_ns(clock_timestamp()));
    parts text[] := radix._split_qualified(job, 'job');
    j record;
    first_k numeric;
    n numeric;
    ticks bigint[];
BEGIN
    IF from_time IS NULL OR to_time IS NULL OR from_time >= to_time THEN
        RAISE EXCEPTION 'RUN JOB ... FOR RANGE needs a start before its end' USING ERRCODE = '22023';
    END IF;
    SELECT o.job_id, o.schedule_kind, o.interval_ns, o.at_ns, radix.job_anchor_ns(o.job_id) AS anchor_ns INTO j
    FROM radix.job_overview o WHERE o.schema_name = parts[1] AND o.job_name = parts[2];
    IF j.job_id IS NULL THEN
        RAISE EXCEPTION 'job % does not exist', job USING ERRCODE = '42704';
    END IF;
    IF j.schedule_kind = 'cron' THEN
        IF cron_ticks IS NULL THEN
            RAISE EXCEPTION 'job % has a CRON schedule: its ticks are computed by radixjobs', job
                USING ERRCODE = '22023', HINT = 'Run RUN JOB ... FOR RANGE through radixjobs (sql, the Python API).';
        END IF;
        IF EXISTS (SELECT 1 FROM unnest(cron_ticks) t WHERE t IS NULL OR t < a OR t >= radix.to_ns(to_time)) THEN
            RAISE EXCEPTION 'a cron tick given is outside the range' USING ERRCODE = '22023';
        END IF;
        ticks := ARRAY(SELECT t FROM unnest(cron_ticks) t WHERE t < b);
    ELSIF cron_ticks IS NOT NULL THEN
        RAISE EXCEPTION 'ticks are given only for a CRON job' USING ERRCODE = '22023';
    ELSIF j.schedule_kind = 'at' THEN
        ticks := CASE WHEN j.at_ns >= a AND j.at_ns < b THEN ARRAY[j.at_ns] ELSE '{}' END;
    ELSE
        -- grid anchor + k*interval, k >= 1 as the schedule counts it
        first_k := greatest(1, ceil((a - j.anchor_ns)::numeric / j.interval_ns));
        n := greatest(0, ceil((b - j.anchor_ns)::numeric / j.interval_ns) - first_k);
        IF n > radix.max_requested_ticks() THEN
            RAISE EXCEPTION 'RUN JOB would queue % ticks, above the limit of % per statement', n,
                radix.max_requested_ticks() USING ERRCODE = '54000', HINT = 'Split the range.';
        END IF;
        ticks := ARRAY(SELECT (j.anchor_ns + (first_k + i) * j.interval_ns)::bigint
                       FROM generate_series(0, n - 1) AS i);
    END IF;
    RETURN cardinality(radix._request_ticks(current_user, job, ticks, 'backfill'));
END $$;

-- The grid anchor of a job the caller sees (for backfill's EVERY ticks); NULL otherwise.
CREATE FUNCTION radix.job_anchor_ns(job uuid) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN (SELECT s.anchor_ns FROM radix.radix_system_job_state s JOIN radix.jobs j USING (job_id)
        WHERE s.job_id = job AND radix._owner_visible(j.owner_oid));

GRANT EXECUTE ON FUNCTION radix.run_job(text), radix.backfill_job(text, timestamptz, timestamptz, bigint[]),
    radix.job_anchor_ns(uuid), radix._request_ticks(name, text, bigint[], text) TO PUBLIC;

-- -- re-arming -----------------------------------------------------------------------------------------

-- As _arm_state (0010), and: `keep_anchor` keeps an EVERY job's grid anchor (ALTER ... SET, CREATE OR
-- REPLACE) unless STARTING AT gives one; a completed one-time job stays complete only for the same AT
-- time; DISABLE drops the queued requests, any other re-arm puts a request in flight back in the queue.
CREATE FUNCTION radix._rearm(j radix.jobs, keep_anchor boolean) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
        planned := anchor + j.interval_ns * greatest(1, (greatest(now_ns - anchor, 0) / j.interval_ns) + 1);
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
    IF NOT j.enabled THEN
        DELETE FROM radix.job_requests WHERE job_id = j.job_id;
    ELSIF old.request_kind IS NOT NULL THEN
        INSERT INTO radix.job_requests (job_id, planned_ns, kind, requested_by)
        VALUES (j.job_id, old.planned_ns, old.request_kind, j.owner_name) ON CONFLICT DO NOTHING;
    END IF;
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
        error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                                   'category', 'connection',
                                   'detail', jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = j.job_id AND h.status = 'running';
    UPDATE radix.radix_system_job_state SET
        definition_version = j.definition_version, status = new_status,
        anchor_ns = anchor, planned_ns = planned,
        due_ns = CASE WHEN new_status = 'scheduled' THEN coalesce(planned, now_ns) END,
        attempt = 0,
        idempotency_key = CASE WHEN done THEN j.job_id::text || '/' || j.at_ns::text END,
        lease_node = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = CASE WHEN done THEN last_error END,
        request_kind = NULL, stash = NULL,
        fence_node = CASE WHEN old.status = 'running' THEN old.lease_node ELSE old.fence_node END,
        fence_token = CASE WHEN old.status = 'running' THEN old.lease_token ELSE old.fence_token END,
        updated_at = clock_timestamp()
    WHERE job_id = j.job_id;
    IF NOT FOUND THEN
        INSERT INTO radix.radix_system_job_state
            (job_id, definition_version, status, anchor_ns, planned_ns, due_ns, attempt)
        VALUES (j.job_id, j.definition_version, new_status, anchor, planned,
                CASE WHEN new_status = 'scheduled' THEN coalesce(planned, now_ns) END, 0);
    END IF;
    PERFORM radix._promote_request(j.job_id);
    PERFORM radix._hint('radix_jobs', j.job_id::text);
END $$;

CREATE OR REPLACE FUNCTION radix._arm_state(j radix.jobs) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT radix._rearm(j, false);
END;

-- -- ALTER JOB ... SET / RESET / RENAME, CREATE OR REPLACE JOB -----------------------------------------

-- Change a job: each argument that is not NULL is a change, admitted as CREATE JOB admits it (a new
-- principal: the SET rule for the caller and the owner; a new call: `binding`, resolved on the caller's
-- side, checked against the catalog; a new name: CREATE on its schema). Options: `reset` names go back to
-- their defaults, then the schedule is set, then `opts` (normalised) apply. Returns false when nothing
-- changed; otherwise definition_version is bumped, and the state re-armed unless only the name, history
-- or max_attempts changed.
CREATE FUNCTION radix._change_job(creator name, job text, enabled boolean, schedule jsonb, run_as text,
                                  procedure text, binding jsonb, opts jsonb, reset text[], rename_to text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    j radix.jobs := radix._job_for_change(caller, job);
    prior_timeout text;
    n radix.jobs;
    parts text[];
    principal pg_roles;
    bound jsonb;
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
        n := radix._with_schedule(n, radix._normalise_schedule(schedule));
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
    IF n IS NOT DISTINCT FROM j THEN
        RETURN false;
    END IF;
    quiet := (n.schema_name, n.job_name, n.history_limit, n.max_attempts) IS DISTINCT FROM
             (j.schema_name, j.job_name, j.history_limit, j.max_attempts)
         AND (n.principal_oid, n.procedure_oid, n.procedure_signature, n.arguments, n.schedule_kind, n.interval_ns,
              n.starting_at_ns, n.at_ns, n.cron_expression, n.cron_time_zone, n.enabled, n.deadline_ms,
              n.coalesce_ticks)
             IS NOT DISTINCT FROM
             (j.principal_oid, j.procedure_oid, j.procedure_signature, j.arguments, j.schedule_kind, j.interval_ns,
              j.starting_at_ns, j.at_ns, j.cron_expression, j.cron_time_zone, j.enabled, j.deadline_ms,
              j.coalesce_ticks);
    prior_timeout := radix._bound_lock_wait();
    BEGIN
        UPDATE radix.jobs SET schema_name = n.schema_name, job_name = n.job_name,
            principal_oid = n.principal_oid, principal_name = n.principal_name,
            procedure_oid = n.procedure_oid, procedure_signature = n.procedure_signature, arguments = n.arguments,
            schedule_kind = n.schedule_kind, interval_ns = n.interval_ns, starting_at_ns = n.starting_at_ns,
            at_ns = n.at_ns, cron_expression = n.cron_expression, cron_time_zone = n.cron_time_zone,
            enabled = n.enabled, deadline_ms = n.deadline_ms, max_attempts = n.max_attempts,
            history_limit = n.history_limit, coalesce_ticks = n.coalesce_ticks, non_atomic = n.non_atomic,
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
    ELSE
        PERFORM radix._rearm(n, j.enabled AND n.enabled
                                AND n.starting_at_ns IS NOT DISTINCT FROM j.starting_at_ns);
    END IF;
    PERFORM radix._hint('radix_jobs', n.job_id::text);
    RETURN true;
END $$;

-- Public entry point of ALTER JOB: ENABLE/DISABLE (`enabled`), SET SCHEDULE (`schedule`, as create_job
-- takes it), SET RUN AS (`run_as`), SET CALL (`procedure` with `arguments`, resolved here with the
-- caller's rights as CREATE JOB resolves them), SET (...) (`options`), RESET (...) (`reset`), RENAME TO
-- (`rename_to`). Returns true when the job changed. Signature changed from 0002: dropped and created again.
DROP FUNCTION radix.alter_job(text, boolean);
CREATE FUNCTION radix.alter_job(job text, enabled boolean DEFAULT NULL, schedule jsonb DEFAULT NULL,
                                run_as text DEFAULT NULL, procedure text DEFAULT NULL,
                                arguments jsonb DEFAULT NULL, options jsonb DEFAULT NULL,
                                reset text[] DEFAULT NULL, rename_to text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
                             radix._normalise_options(options), reset, rename_to);
END $$;
GRANT EXECUTE ON FUNCTION radix.alter_job(text, boolean, jsonb, text, text, jsonb, jsonb, text[], text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION radix._change_job(name, text, boolean, jsonb, text, text, jsonb, jsonb, text[], text)
    TO PUBLIC;

-- As 0010, with the options (normalised) instead of deadline_ms.
DROP FUNCTION radix._create_job(name, text, jsonb, text, text, jsonb, boolean, boolean, integer);
CREATE FUNCTION radix._create_job(creator name, job text, schedule jsonb, run_as text, procedure text,
                                  binding jsonb, enabled boolean, if_not_exists boolean, opts jsonb)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    job_parts text[] := radix._split_qualified(job, 'job');
    proc_parts text[] := radix._split_qualified(procedure, 'procedure');
    existing uuid := radix._check_admission(caller, job_parts, run_as, if_not_exists);
    principal pg_roles;
    bound jsonb;
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
    j := radix._with_options(radix._with_schedule(j, radix._normalise_schedule(schedule)), opts, NULL);
    INSERT INTO radix.jobs (schema_name, job_name, owner_oid, owner_name, principal_oid, principal_name,
                            procedure_oid, procedure_signature, arguments, schedule_kind, interval_ns,
                            starting_at_ns, at_ns, cron_expression, cron_time_zone, enabled, deadline_ms,
                            max_attempts, history_limit, coalesce_ticks)
    VALUES (job_parts[1], job_parts[2], caller, (SELECT rolname FROM pg_roles WHERE oid = caller),
            principal.oid, principal.rolname, (bound->>'procedure_oid')::oid, bound->>'signature',
            bound->'arguments', j.schedule_kind, j.interval_ns, j.starting_at_ns, j.at_ns, j.cron_expression,
            j.cron_time_zone, coalesce(enabled, true), coalesce(j.deadline_ms, 240000),
            coalesce(j.max_attempts, 5), coalesce(j.history_limit, 256), coalesce(j.coalesce_ticks, true))
    RETURNING * INTO j;
    PERFORM radix._rearm(j, false);
    RETURN j.job_id;
END $$;
GRANT EXECUTE ON FUNCTION radix._create_job(name, text, jsonb, text, text, jsonb, boolean, boolean, jsonb)
    TO PUBLIC;

-- Does `job` exist (for CREATE OR REPLACE: replace it, or create it)? Any caller may ask of a name.
CREATE FUNCTION radix._job_exists(job text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN EXISTS (SELECT 1 FROM radix.jobs j, radix._split_qualified(job, 'job') AS p(parts)
               WHERE j.schema_name = p.parts[1] AND j.job_name = p.parts[2]);
GRANT EXECUTE ON FUNCTION radix._job_exists(text) TO PUBLIC;

-- Public entry point: as 0010, with `options` (WITH (...): timeout, max_attempts, history, coalesce,
-- time_zone; `timeout` wins over deadline_ms) and `or_replace` (CREATE OR REPLACE JOB: an existing job
-- keeps its id, owner and history, everything else is replaced, options not given go back to their
-- defaults; admitted as ALTER JOB ... SET admits each change). Signature changed: dropped and created again.
DROP FUNCTION radix.create_job(text, jsonb, text, text, jsonb, boolean, boolean, integer, interval);
CREATE FUNCTION radix.create_job(job text, schedule jsonb, run_as text, procedure text,
                                 arguments jsonb DEFAULT '[]', enabled boolean DEFAULT true,
                                 if_not_exists boolean DEFAULT false, deadline_ms integer DEFAULT 240000,
                                 timeout interval DEFAULT NULL, options jsonb DEFAULT NULL,
                                 or_replace boolean DEFAULT false)
RETURNS uuid LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
    opts := radix._normalise_options(options);
    IF timeout IS NOT NULL THEN
        opts := opts || radix._normalise_options(jsonb_build_object('timeout', timeout::text));
    ELSIF NOT opts ? 'deadline_ms' AND deadline_ms IS NOT NULL THEN
        opts := opts || jsonb_build_object('deadline_ms', radix._check_timeout(deadline_ms, deadline_ms::text || ' ms'));
    END IF;
    IF or_replace AND radix._job_exists(job) THEN
        PERFORM radix._change_job(current_user, job, coalesce(enabled, true), schedule, run_as, procedure,
                                  radix._resolve_call(proc_parts[1], proc_parts[2], args), opts,
                                  ARRAY['timeout', 'max_attempts', 'history', 'coalesce', 'time_zone'], NULL);
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
GRANT EXECUTE ON FUNCTION radix.create_job(text, jsonb, text, text, jsonb, boolean, boolean, integer, interval,
                                           jsonb, boolean) TO PUBLIC;

-- -- replaced from 0010: the claim --------------------------------------------------------------------

-- As 0010, and: a request's tick (RUN JOB, backfill) is never coalesced, and is claimed whether or not
-- cron ticks await planning (its time is fixed); with coalesce = off an EVERY
-- job's missed ticks are run oldest first, at most radix.max_missed_ticks() of them (older ones are
-- skipped and counted as coalesced); the history row says what started the attempt (run_kind); and each
-- job keeps its own number of history rows (history_limit).
CREATE OR REPLACE FUNCTION radix.claim_due(node text, max_claims integer, with_cron boolean DEFAULT true,
                                max_per_principal integer DEFAULT NULL, lease_seconds integer DEFAULT 300)
RETURNS TABLE (job_id uuid, definition_version bigint, lease_token uuid, planned_ns bigint,
               attempt integer, idempotency_key text, resumed boolean, coalesced bigint,
               anchor_ns bigint)
LANGUAGE plpgsql VOLATILE ROWS 16
SET search_path = pg_catalog, pg_temp
-- the statements' plans do not depend on the values (index scans by key, ordered by due_ns); custom
-- plans were re-made at every call (~0.8 ms, most of a claim's cost)
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    now_ts timestamptz := clock_timestamp();
    now_ns bigint := radix.to_ns(now_ts);
    lease interval := make_interval(secs => greatest(coalesce(lease_seconds, 300), 1));
    cap integer := nullif(greatest(max_per_principal, 0), 0);
    dead text[] := '{}';
    picked uuid[] := '{}';
    resuming boolean;
    budget integer;
    ps oid[];
    runs integer[];
    dues bigint[];
    shares oid[];
    share_counts integer[];
    took_ids uuid[];
    took oid[];
BEGIN
    -- by its tid (the table has one row, never updated): a Tid Scan, not a Seq Scan in the claim's plans
    PERFORM 1 FROM radix.claim_serial WHERE ctid = '(0,1)'::tid FOR UPDATE;
    IF NOT FOUND THEN  -- rewritten elsewhere by hand: still serialise
        PERFORM 1 FROM radix.claim_serial FOR UPDATE;
    END IF;
    IF EXISTS (SELECT 1 FROM radix.radix_system_job_state s WHERE s.status = 'running' AND s.lease_node <> node)
    THEN
        dead := ARRAY(
            SELECT DISTINCT s.lease_node
            FROM radix.radix_system_job_state s LEFT JOIN radix.nodes n ON n.node_id = s.lease_node
            WHERE s.status = 'running' AND s.lease_node <> node
              AND (n.node_id IS NULL OR NOT EXISTS (
                    SELECT 1 FROM pg_stat_get_activity(n.backend_pid) a WHERE a.backend_start = n.backend_start)));
    END IF;
    IF cardinality(dead) > 0 THEN
        picked := ARRAY(
            SELECT s.job_id FROM radix.radix_system_job_state s
            WHERE s.status = 'running' AND s.lease_node = ANY (dead)
              AND NOT EXISTS (
                  SELECT 1 FROM radix.attempt_frames f
                  WHERE f.job_id = s.job_id AND EXISTS (
                      SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start))
            ORDER BY s.due_ns
            LIMIT max_claims
            FOR UPDATE SKIP LOCKED);
    END IF;
    budget := max_claims - cardinality(picked);
    -- min(): an index probe of radix_system_job_state_due whatever the generic plan thinks of due_ns <= now
    IF budget > 0 AND (SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                       WHERE s.status IN ('scheduled', 'retry_wait', 'running')) <= now_ns THEN
        SELECT coalesce(array_agg(l.principal), '{}'), coalesce(array_agg(l.running), '{}'),
               coalesce(array_agg(l.first_due_ns), '{}')
        INTO ps, runs, dues
        FROM radix._principal_load() l
        WHERE l.first_due_ns <= now_ns AND (cap IS NULL OR l.running < cap);
        -- every round ends the claim or drops a principal (done or at its cap): at most one per principal
        FOR deal IN 1 .. cardinality(ps) LOOP
            EXIT WHEN budget <= 0 OR cardinality(ps) = 0;
            SELECT array_agg(sh.principal), array_agg(sh.share) INTO shares, share_counts
            FROM radix._claim_shares(ps, runs, dues, budget, cap) sh;
            EXIT WHEN shares IS NULL;
            SELECT coalesce(array_agg(c.job_id), '{}'), coalesce(array_agg(c.principal_oid), '{}')
            INTO took_ids, took
            FROM unnest(shares, share_counts) AS q(p, n)
            CROSS JOIN LATERAL (
                SELECT s.job_id, s.principal_oid FROM radix.radix_system_job_state s
                WHERE s.principal_oid = q.p
                  AND s.status IN ('scheduled', 'retry_wait', 'running') AND s.due_ns <= now_ns
                  AND s.planned_ns IS NOT NULL
                  AND (s.status <> 'running' OR s.lease_expires_at < now_ts)
                  AND s.job_id <> ALL (picked)
                  AND (s.fence_token IS NULL OR NOT radix.node_alive(s.fence_node))
                  AND (with_cron OR s.request_kind IS NOT NULL OR NOT EXISTS (
                          SELECT 1 FROM radix.jobs j WHERE j.job_id = s.job_id AND j.schedule_kind = 'cron'))
                  AND NOT EXISTS (
                      SELECT 1 FROM radix.attempt_frames f
                      WHERE f.job_id = s.job_id AND EXISTS (
                          SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start))
                ORDER BY s.due_ns
                LIMIT q.n
                FOR UPDATE OF s SKIP LOCKED) c;
            picked := picked || took_ids;
            budget := budget - cardinality(took_ids);
            -- a principal that got fewer rows than its share has no more (claimable) due work
            SELECT coalesce(array_agg(u.p), '{}'), coalesce(array_agg(u.n + coalesce(t.k, 0)), '{}'),
                   coalesce(array_agg(u.due), '{}')
            INTO ps, runs, dues
            FROM unnest(ps, runs, dues) AS u(p, n, due)
            LEFT JOIN unnest(shares, share_counts) AS q(p, n) ON q.p = u.p
            LEFT JOIN (SELECT x.p, count(*)::integer AS k FROM unnest(took) AS x(p) GROUP BY x.p) t ON t.p = u.p
            WHERE (q.p IS NULL OR coalesce(t.k, 0) >= q.n)
              AND (cap IS NULL OR u.n + coalesce(t.k, 0) < cap);
        END LOOP;
    END IF;
    IF cardinality(picked) = 0 THEN
        RETURN;
    END IF;
    resuming := cardinality(dead) > 0 OR EXISTS (
        SELECT 1 FROM radix.radix_system_job_state s WHERE s.job_id = ANY (picked) AND s.status = 'running');

    -- fresh claims: a history row still 'running' for the job belongs to no attempt (its state is not
    -- running); close it before the new attempt's row is written
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = now_ts,
        error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                                   'category', 'connection',
                                   'detail', jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = ANY (picked) AND h.status = 'running'  -- radix_system_job_history_running
      AND NOT EXISTS (SELECT 1 FROM radix.radix_system_job_state s
                      WHERE s.job_id = h.job_id AND s.status = 'running');

    RETURN QUERY
    WITH decided AS (
        SELECT s.job_id, s.status = 'running' AS resumed,
               CASE WHEN s.status = 'scheduled' AND j.schedule_kind = 'every' AND s.planned_ns <= now_ns
                         AND s.request_kind IS NULL
                    THEN s.planned_ns + greatest(
                             (now_ns - s.planned_ns) / j.interval_ns
                             - CASE WHEN j.coalesce_ticks THEN 0 ELSE radix.max_missed_ticks() - 1 END,
                             0) * j.interval_ns
                    ELSE s.planned_ns END AS new_planned,
               coalesce(s.request_kind, 'schedule') AS run_kind,
               s.planned_ns AS old_planned, j.interval_ns, j.schedule_kind
        FROM radix.radix_system_job_state s JOIN radix.jobs j USING (job_id)
        WHERE s.job_id = ANY (picked)
    ), claimed AS (
        UPDATE radix.radix_system_job_state s SET
            status = 'running',
            planned_ns = d.new_planned,
            attempt = CASE WHEN d.resumed THEN greatest(s.attempt, 1) ELSE s.attempt + 1 END,
            idempotency_key = s.job_id::text || '/' || d.new_planned::text,
            lease_node = node,
            lease_token = gen_random_uuid(),
            lease_expires_at = now_ts + lease,
            due_ns = radix.to_ns(now_ts + lease),
            coalesced_ticks = s.coalesced_ticks + CASE WHEN d.schedule_kind = 'every'
                THEN (d.new_planned - d.old_planned) / d.interval_ns ELSE 0 END,
            updated_at = now_ts
        FROM decided d WHERE s.job_id = d.job_id
        RETURNING s.job_id, s.definition_version, s.lease_token, s.planned_ns, s.attempt,
                  s.idempotency_key, d.resumed, d.run_kind,
                  CASE WHEN d.schedule_kind = 'every' THEN (d.new_planned - d.old_planned) / d.interval_ns
                       ELSE 0 END AS coalesced,
                  s.anchor_ns
    ), lost AS (
        UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = now_ts,
            error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                                       'category', 'connection', 'detail',
                                       jsonb_build_object('scheduler_retryable', true))
        FROM claimed c
        WHERE c.resumed AND h.job_id = c.job_id AND h.planned_ns = c.planned_ns
          AND h.attempt = c.attempt AND h.status = 'running'
        RETURNING h.job_id
    ), started AS (
        INSERT INTO radix.radix_system_job_history
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind)
        SELECT c.job_id, c.definition_version, c.planned_ns, c.attempt, c.idempotency_key, 'running', node,
               c.run_kind
        FROM claimed c WHERE NOT c.resumed
        RETURNING 1
    )
    SELECT c.job_id, c.definition_version, c.lease_token, c.planned_ns, c.attempt, c.idempotency_key,
           c.resumed, c.coalesced, c.anchor_ns
    FROM claimed c;

    -- resumed claims: the lost row was closed above; the new attempt gets its own row
    IF resuming THEN
        INSERT INTO radix.radix_system_job_history
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind)
        SELECT s.job_id, s.definition_version, s.planned_ns, s.attempt, s.idempotency_key, 'running', node,
               coalesce(s.request_kind, 'schedule')
        FROM unnest(picked) AS p(job_id) JOIN radix.radix_system_job_state s ON s.job_id = p.job_id
        WHERE s.lease_node = node AND s.status = 'running' AND s.updated_at = now_ts
          AND NOT EXISTS (SELECT 1 FROM radix.radix_system_job_history h
                          WHERE h.job_id = s.job_id AND h.planned_ns = s.planned_ns
                            AND h.attempt = s.attempt AND h.status = 'running');
    END IF;
    -- keep at most `history` rows per job (WITH (history = N), 256 by default)
    DELETE FROM radix.radix_system_job_history h USING unnest(picked) AS p(job_id)
    WHERE h.job_id = p.job_id AND h.history_id <= (
        SELECT o.history_id FROM radix.radix_system_job_history o WHERE o.job_id = p.job_id
        ORDER BY o.history_id DESC
        OFFSET (SELECT j.history_limit FROM radix.jobs j WHERE j.job_id = p.job_id) LIMIT 1);
END $$;

-- -- replaced from 0010: the views ---------------------------------------------------------------------

-- As 0010, with the options, the request in progress and the queued requests.
CREATE OR REPLACE VIEW radix.job_overview WITH (security_barrier) AS
SELECT j.job_id, quote_ident(j.schema_name) || '.' || quote_ident(j.job_name) AS name,
       j.schema_name, j.job_name, j.owner_name AS owner, j.principal_name AS principal,
       j.procedure_signature AS procedure, j.arguments,
       CASE j.schedule_kind
           WHEN 'every' THEN 'EVERY ' || (j.interval_ns / 1000 * interval '1 microsecond')::text
                || coalesce(' STARTING AT ' || radix.from_ns(j.starting_at_ns)::text, '')
           WHEN 'at' THEN 'AT ' || radix.from_ns(j.at_ns)::text
           ELSE 'CRON ' || quote_literal(j.cron_expression) || ' TIME ZONE ' || quote_literal(j.cron_time_zone)
       END AS schedule,
       j.schedule_kind, j.interval_ns, j.starting_at_ns, j.at_ns, j.cron_expression, j.cron_time_zone,
       j.enabled, j.definition_version, j.deadline_ms, j.non_atomic, j.created_at,
       s.status, s.planned_ns,
       CASE s.status WHEN 'scheduled' THEN radix.from_ns(s.planned_ns)
                     WHEN 'running' THEN radix.from_ns(s.planned_ns)
                     WHEN 'retry_wait' THEN radix.from_ns(s.due_ns) END AS next_run_at,
       s.attempt, s.due_ns,
       s.idempotency_key, s.lease_node, s.lease_expires_at, s.coalesced_ticks, s.last_error,
       j.max_attempts, j.history_limit, j.coalesce_ticks, s.request_kind,
       (SELECT count(*) FROM radix.job_requests q WHERE q.job_id = j.job_id) AS queued_runs
FROM radix.jobs j LEFT JOIN radix.radix_system_job_state s USING (job_id)
WHERE radix._owner_visible(j.owner_oid);

CREATE OR REPLACE VIEW radix.job_history WITH (security_barrier) AS
SELECT h.history_id, h.job_id, quote_ident(j.schema_name) || '.' || quote_ident(j.job_name) AS name,
       h.definition_version, h.planned_ns, radix.from_ns(h.planned_ns) AS planned_at, h.attempt,
       h.idempotency_key, h.status, h.node, h.atomic, h.started_at, h.finished_at,
       h.finished_at - h.started_at AS duration, h.error, h.run_kind
FROM radix.radix_system_job_history h JOIN radix.jobs j USING (job_id)
WHERE radix._owner_visible(j.owner_oid);

-- Internal: the scheduler's (and the definer functions') only.
REVOKE ALL ON FUNCTION radix._promote_request(uuid), radix._job_for_change(oid, text), radix._rearm(radix.jobs, boolean),
    radix._with_options(radix.jobs, jsonb, text[]), radix._with_schedule(radix.jobs, jsonb),
    radix._check_principal(oid, oid, text) FROM PUBLIC;

-- -- replaced from 0003: finish_attempt clears a fence ------------------------------------------------

-- As 0003, and an attempt whose lease was lost by a re-arm (its token is the fence) clears the fence when
-- its node reports it ended, so the job's next attempt may start.
CREATE OR REPLACE FUNCTION radix.finish_attempt(job uuid, token uuid, outcome text, error jsonb,
                                                retry_delay_ns bigint, next_planned_ns bigint,
                                                atomic boolean, mark_non_atomic boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s radix.radix_system_job_state;
    ok boolean;
BEGIN
    SELECT * INTO s FROM radix.radix_system_job_state
    WHERE job_id = job AND lease_token = token AND status = 'running' FOR UPDATE;
    IF NOT FOUND THEN
        UPDATE radix.radix_system_job_state SET fence_node = NULL, fence_token = NULL
        WHERE job_id = job AND fence_token = token;
        IF FOUND THEN
            PERFORM radix._hint('radix_jobs', job::text);
        END IF;
        RETURN false;
    END IF;
    IF outcome = 'retrying' THEN
        UPDATE radix.radix_system_job_state SET status = 'retry_wait',
            due_ns = radix.to_ns(clock_timestamp()) + retry_delay_ns,
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, last_error = error,
            updated_at = clock_timestamp()
        WHERE job_id = job;
    ELSE
        ok := radix._advance(job, token, next_planned_ns, outcome = 'succeeded', error);
    END IF;
    UPDATE radix.radix_system_job_history SET status = outcome, error = finish_attempt.error,
        finished_at = clock_timestamp(), atomic = finish_attempt.atomic
    WHERE job_id = job AND planned_ns = s.planned_ns AND attempt = s.attempt AND status = 'running';
    IF mark_non_atomic THEN
        UPDATE radix.jobs SET non_atomic = true WHERE job_id = job AND NOT non_atomic;
    END IF;
    DELETE FROM radix.attempt_frames WHERE job_id = job AND lease_token = token;
    RETURN true;
END $$;
