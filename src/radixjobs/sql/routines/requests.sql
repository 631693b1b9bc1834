-- Requests: RUN JOB and BACKFILL JOB queue ticks, promoted one at a time into the job's state.

-- RUN JOB / RUN JOB ... FOR RANGE: queue `ticks` (planned times, ns) as requests of `kind`; the same
-- rights as ALTER JOB. Ticks already queued, the job's current tick (which will run anyway), or done (a
-- succeeded attempt in the history, or a backfill tick recorded done) are skipped. Returns the ticks queued.
CREATE OR REPLACE FUNCTION radix._request_ticks(creator name, job text, ticks bigint[], kind text) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
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
CREATE OR REPLACE FUNCTION radix.run_job(job text) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

-- A request is installed only while no tick of the job is in progress (its lock free): the tick ends by
-- installing it (end_tick), so a RUN JOB never rolls a running tick back; one left queued otherwise (the
-- tick failed, or its daemon died) is installed by the next radix.find_ticks.
CREATE OR REPLACE FUNCTION radix._promote_request(job uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    s radix.radix_system_job_state;
    r radix.job_requests;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = job) THEN
        RETURN false;
    END IF;
    PERFORM FROM radix.tick_locks t WHERE t.job_id = job FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT * INTO s FROM radix.radix_system_job_state WHERE job_id = job;
    IF NOT FOUND OR s.status IN ('running', 'retry_wait') OR s.request_kind IS NOT NULL THEN
        RETURN false;
    END IF;
    -- an on_failure hook owed goes first (hooks.sql), then the oldest tick
    DELETE FROM radix.job_requests q
    WHERE (q.job_id, q.planned_ns) = (SELECT o.job_id, o.planned_ns FROM radix.job_requests o
                                      WHERE o.job_id = job ORDER BY o.kind <> 'on_failure', o.planned_ns LIMIT 1)
    RETURNING * INTO r;
    UPDATE radix.radix_system_job_state SET
        stash = jsonb_build_object('status', s.status, 'planned_ns', s.planned_ns, 'due_ns', s.due_ns,
                                   'attempt', s.attempt, 'idempotency_key', s.idempotency_key,
                                   'last_error', s.last_error),
        request_kind = r.kind, request_detail = r.detail, status = 'scheduled', planned_ns = r.planned_ns,
        due_ns = radix.to_ns(clock_timestamp()), attempt = 0, idempotency_key = NULL,
        updated_at = clock_timestamp()
    WHERE job_id = job;
    PERFORM radix._hint('radix_jobs', job::text);
    RETURN true;
END $$;

-- The grid anchor of a job the caller may change (for backfill's EVERY ticks), checked as the caller.
CREATE OR REPLACE FUNCTION radix._job_anchor_ns(creator name, job text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (SELECT s.anchor_ns FROM radix.radix_system_job_state s
            WHERE s.job_id = (radix._job_for_change(radix._caller(creator), job)).job_id);
END $$;

-- BACKFILL JOB name FOR RANGE: queues the ticks the schedule had in [from_time, to_time] (cron ticks given
-- by the caller, computed by the daemon's schedule code); the anchor is read through _job_anchor_ns.
CREATE OR REPLACE FUNCTION radix.backfill_job(job text, from_time timestamptz, to_time timestamptz,
                                   cron_ticks bigint[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
    SELECT o.job_id, o.schedule_kind, o.interval_ns, o.at_ns, o.starting_at_ns,
           radix._job_anchor_ns(current_user, job) AS anchor_ns INTO j
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
        -- grid anchor + k*interval as the schedule counts it: k >= 0 from STARTING AT, else k >= 1 (the
        -- instant the job was armed is the grid's origin, not a tick)
        first_k := greatest(CASE WHEN j.starting_at_ns IS NULL THEN 1 ELSE 0 END,
                            ceil((a - j.anchor_ns)::numeric / j.interval_ns));
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
