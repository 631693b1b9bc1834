-- 0015: the tick keeps its job's history at its limit without counting it (issue #14).
--
-- radix.end_tick kept a job to its `history` rows (256 by default) with radix._prune_history: a walk of the
-- job's rows from the newest, past its limit, at every tick. A recurring job reaches its limit after as many
-- runs, and from then on every tick walked 257 index entries to delete one row: about 50 µs of the server's
-- CPU per tick (python bench/run.py tickcost --history 256, against --history 0).
--
-- The state row now says how many history rows its job has: `history_rows`, NULL when unknown. Only
-- end_tick writes a count, and only end_tick inserts history rows without invalidating it (they are
-- 'succeeded' from the start); every other row inserted for a job on the one-transaction path (a claim, a
-- tick made a lease, a lost tick: 'running', 'lease_lost', …) sets it to NULL and moves `history_epoch` on,
-- by the trigger below, in the inserting transaction. Rows are deleted only by the prunes that follow those
-- inserts in the same transactions, by end_tick, and with the job (DROP JOB). So, per job:
--
--   history_rows IS NOT NULL  =>  it is the job's number of history rows, and none of them is 'running'
--
-- end_tick reads (history_rows, history_epoch) in one snapshot; when unknown, it counts the rows (at most
-- limit + 1 index entries: none for a new job) with the epoch, and closes a 'running' row left by a fenced
-- lease, as every tick did before (with the count known there is none).
-- Its state UPDATE writes the new count only if history_epoch is still the one it read (the UPDATE sees the
-- newest row version: a row inserted meanwhile by another transaction has moved the epoch, and the count is
-- written as unknown). Then, with a known count c, it deletes the c + 1 − limit oldest rows, if any, by one
-- forward probe; with an unknown count, it prunes by the walk as before.
--
-- Jobs on the lease path (state.via_lease: cron schedules, non-atomic procedures) never get a count: their
-- inserts leave the state alone (their claims write the state row anyway), and a job moved to the tick path
-- (ALTER JOB) starts unknown. A history row deleted by hand makes the count too high: the job then keeps
-- fewer rows than its limit until its next lease-path event, never more.

-- -- storage -------------------------------------------------------------------------------------------

ALTER TABLE radix.radix_system_job_state
    ADD COLUMN history_rows integer,
    ADD COLUMN history_epoch bigint NOT NULL DEFAULT 0;

-- A history row that end_tick did not write itself: the count of a tick-path job is unknown from now on.
CREATE FUNCTION radix._history_rows_unknown() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE radix.radix_system_job_state s SET history_rows = NULL, history_epoch = s.history_epoch + 1
    WHERE s.job_id = NEW.job_id AND NOT s.via_lease;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION radix._history_rows_unknown() FROM PUBLIC;
CREATE TRIGGER history_rows_unknown AFTER INSERT ON radix.radix_system_job_history
    FOR EACH ROW WHEN (NEW.status <> 'succeeded') EXECUTE FUNCTION radix._history_rows_unknown();

-- A job that changes path starts with its count unknown (inserts on the lease path are not counted).
CREATE OR REPLACE FUNCTION radix._job_path_changed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE radix.radix_system_job_state s SET via_lease = NEW.non_atomic OR NEW.schedule_kind = 'cron',
        history_rows = NULL, history_epoch = s.history_epoch + 1
    WHERE s.job_id = NEW.job_id AND s.via_lease IS DISTINCT FROM (NEW.non_atomic OR NEW.schedule_kind = 'cron');
    RETURN NULL;
END $$;

-- -- the tick's end ---------------------------------------------------------------------------------------

-- End the tick begun on this backend (0013), its history kept to the limit from the count (above).
CREATE OR REPLACE FUNCTION radix.end_tick(job uuid, mac text, next_planned_ns bigint, node text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- key lookups whatever the values: a custom plan per call would re-plan every statement of every tick
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    f record;
    counted integer;  -- the job's history rows as read, before this tick's
    epoch bigint;     -- history_epoch when they were read
    kept integer;     -- the count written: NULL when unknown
    keep integer;     -- the job's history limit
    unknown boolean;  -- the count was unknown: counted here
BEGIN
    DELETE FROM radix.attempt_frames d WHERE d.pid = pg_backend_pid() AND d.job_id = job
    RETURNING d.planned_ns, d.attempt, d.lease_token, d.idempotency_key,
              (SELECT encode(sha256(sha256(k.secret || int4send(d.pid) || timestamptz_send(d.backend_start))
                                    || uuid_send(d.lease_token)), 'hex') FROM radix.attempt_secret k) AS mac,
              (SELECT ARRAY[s.history_rows, s.history_epoch] FROM radix.radix_system_job_state s
               WHERE s.job_id = job) AS history
    INTO f;
    IF NOT FOUND OR f.mac IS DISTINCT FROM mac THEN
        RAISE EXCEPTION 'the frame of this attempt is gone' USING ERRCODE = 'RXL01';
    END IF;
    counted := (f.history)[1];
    epoch := (f.history)[2];
    unknown := counted IS NULL;
    IF unknown THEN
        -- count them (at most limit + 1 index entries) in one snapshot with the epoch
        SELECT s.history_epoch,
               (SELECT count(*) FROM (SELECT FROM radix.radix_system_job_history o WHERE o.job_id = job
                                      LIMIT j.history_limit + 1) o)
        INTO epoch, counted
        FROM radix.radix_system_job_state s JOIN radix.jobs j ON j.job_id = s.job_id
        WHERE s.job_id = job;
    END IF;
    -- not published: the state is as begin_tick found it (its token still derives from it)
    UPDATE radix.radix_system_job_state s SET
        status = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN 'complete' ELSE 'scheduled' END,
        planned_ns = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN f.planned_ns
                          ELSE next_planned_ns END,
        due_ns = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN NULL ELSE next_planned_ns END,
        attempt = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN f.attempt ELSE 0 END,
        idempotency_key = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN f.idempotency_key END,
        coalesced_ticks = s.coalesced_ticks + CASE WHEN j.schedule_kind = 'every'
                                                   THEN (f.planned_ns - s.planned_ns) / j.interval_ns ELSE 0 END,
        -- (counted here, at most limit + 1 rows were read: limit + 1 means at least that many)
        history_rows = CASE WHEN s.history_epoch = epoch AND (NOT unknown OR counted <= j.history_limit)
                            THEN least(counted + 1, j.history_limit) END,
        last_error = NULL, updated_at = clock_timestamp()
    FROM radix.jobs j, radix.attempt_secret k
    WHERE s.job_id = job AND j.job_id = job AND s.status IN ('scheduled', 'retry_wait')
      AND s.request_kind IS NULL AND s.attempt = f.attempt - 1
      -- radix._tick_token(job, f.planned_ns, s.attempt, s.updated_at) = f.lease_token, inlined
      AND encode(substring(sha256(k.secret || uuid_send(job) || int8send(f.planned_ns) || int4send(s.attempt)
                                  || timestamptz_send(s.updated_at)) FROM 1 FOR 16), 'hex')::uuid = f.lease_token
    RETURNING s.history_rows, j.history_limit INTO kept, keep;
    IF FOUND THEN
        IF unknown THEN
            -- a history row left 'running' by a lease fenced before (ALTER JOB) belongs to no attempt now (the
            -- same close as claim_due's and claim_tick's); with the count known there is none (header)
            UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
                error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                                           'category', 'connection',
                                           'detail', jsonb_build_object('reason', 'job redefined'))
            WHERE h.job_id = job AND h.status = 'running';
        END IF;
        INSERT INTO radix.radix_system_job_history AS h
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind, atomic,
             started_at, finished_at)
        SELECT job, s.definition_version, f.planned_ns, f.attempt, f.idempotency_key, 'succeeded',
               convert_from(decode(node, 'hex'), 'UTF8'),
               'schedule', true, now(), clock_timestamp()
        FROM radix.radix_system_job_state s WHERE s.job_id = job;
        IF EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = job) THEN
            PERFORM radix._promote_request(job);
        END IF;
        IF kept IS NULL THEN
            PERFORM radix._prune_history(job);
        ELSIF counted + 1 > keep THEN
            -- the oldest rows past the limit (one, but for a lowered limit): the count is exact, so the walk
            -- starts from the oldest and stops at the last row to go
            DELETE FROM radix.radix_system_job_history h
            WHERE h.job_id = job AND h.history_id <= (
                SELECT o.history_id FROM radix.radix_system_job_history o WHERE o.job_id = job
                ORDER BY o.history_id OFFSET counted - keep LIMIT 1);
        END IF;
        RETURN;
    END IF;
    -- published (radix.claim_tick): a lease with the tick's token
    IF NOT radix._advance(job, f.lease_token, next_planned_ns, true, NULL) THEN
        RAISE EXCEPTION 'the claim of this attempt is no longer held' USING ERRCODE = 'RXL01';
    END IF;
    UPDATE radix.radix_system_job_history
    SET status = 'succeeded', atomic = true, started_at = now(), finished_at = clock_timestamp()
    WHERE job_id = job AND planned_ns = f.planned_ns AND attempt = f.attempt AND status = 'running';
END $$;
