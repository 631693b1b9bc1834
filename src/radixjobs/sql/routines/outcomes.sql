-- Outcomes: the state advance, the history row and its pruning.

-- The error of a history row whose attempt lost its lease (a re-arm fenced it, or its node died): one record,
-- written wherever such a row is closed. Inlined into the statement that writes it.
CREATE OR REPLACE FUNCTION radix._lease_lost(detail jsonb) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
RETURN jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost', 'category', 'connection',
                          'detail', detail);

-- The state advance after a tick's attempt ended for good: an AT job, or one with no next tick, ends
-- (complete when it succeeded, else failed) and keeps its tick, attempt and key; any other is scheduled at its
-- next tick (due at its jitter offset, radix._jitter_ns), attempt 0, no key. One row, plain SQL: the planner
-- inlines it into the UPDATE that writes it,
--   SET (status, planned_ns, due_ns, attempt, idempotency_key) = (SELECT * FROM radix._advanced(...)).
CREATE OR REPLACE FUNCTION radix._advanced(kind text, next_ns bigint, succeeded boolean, tick_ns bigint,
                                           tick_attempt integer, tick_key text, job uuid, jitter_ns bigint)
RETURNS TABLE (status text, planned_ns bigint, due_ns bigint, attempt integer, idempotency_key text)
LANGUAGE sql IMMUTABLE ROWS 1
BEGIN ATOMIC
    SELECT CASE WHEN e.ended THEN CASE WHEN succeeded THEN 'complete' ELSE 'failed' END ELSE 'scheduled' END,
           CASE WHEN e.ended THEN tick_ns ELSE next_ns END,
           CASE WHEN e.ended THEN NULL ELSE next_ns + radix._jitter_ns(job, next_ns, jitter_ns) END,
           CASE WHEN e.ended THEN tick_attempt ELSE 0 END,
           CASE WHEN e.ended THEN tick_key END
    FROM (SELECT kind = 'at' OR next_ns IS NULL AS ended) e;
END;

-- How many ticks of a job were coalesced when it ran tick `run_ns` where `planned_ns` was planned: the EVERY
-- ticks between them (cron jobs are planned, and their missed ticks coalesced, by the daemon).
CREATE OR REPLACE FUNCTION radix._ticks_coalesced(kind text, planned_ns bigint, run_ns bigint, interval_ns bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN kind = 'every' THEN (run_ns - planned_ns) / interval_ns ELSE 0 END;

-- The tick an EVERY job found late at `now_ns` runs: the newest one due when it coalesces missed ticks, else
-- the oldest of the newest radix.max_missed_ticks() (the ones before it are coalesced). Due: past its jitter
-- offset (radix._jitter_ns), so the newest tick on the grid counts only once its offset is over.
CREATE OR REPLACE FUNCTION radix._tick_to_run(planned_ns bigint, now_ns bigint, interval_ns bigint,
                                              coalesce_ticks boolean, job uuid, jitter_ns bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN planned_ns + greatest((now_ns - planned_ns) / interval_ns
                             - CASE WHEN now_ns - planned_ns >= interval_ns
                                         AND radix._jitter_ns(job, planned_ns + (now_ns - planned_ns) / interval_ns
                                                                                * interval_ns, jitter_ns)
                                             > (now_ns - planned_ns) % interval_ns
                                    THEN 1 ELSE 0 END
                             - CASE WHEN coalesce_ticks THEN 0 ELSE radix.max_missed_ticks() - 1 END, 0) * interval_ns;

-- The state advance: the job's next tick after an attempt, fenced by its lease token (false: the token no
-- longer holds the claim). A request's tick ends by putting the stashed regular state back (a backfill tick that
-- succeeded is recorded in radix.backfill_done first; an on_failure hook's tick leaves the job's last error as it
-- was); a tick that failed for good queues its hook and event (radix._failed_for_good); the ticks of the jobs
-- that run after it are queued (radix._fire_dependents); then the next queued request, if any, is installed.
CREATE OR REPLACE FUNCTION radix._advance(job uuid, token uuid, next_planned_ns bigint, succeeded boolean,
                                          error jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    j radix.jobs := (SELECT x FROM radix.jobs x WHERE x.job_id = job);
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
            last_error = CASE WHEN succeeded OR s.request_kind = 'on_failure' THEN s.stash->'last_error'
                              ELSE coalesce(error, s.last_error) END,
            request_kind = NULL, stash = NULL, request_detail = NULL,
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = clock_timestamp()
        WHERE job_id = job AND lease_token = token AND status = 'running';
    ELSE
        UPDATE radix.radix_system_job_state st SET
            (status, planned_ns, due_ns, attempt, idempotency_key) =
                (SELECT * FROM radix._advanced(j.schedule_kind, next_planned_ns, succeeded, st.planned_ns,
                                               st.attempt, st.idempotency_key, job, j.jitter_ns)),
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL,
            last_error = coalesce(error, CASE WHEN succeeded THEN NULL ELSE last_error END),
            updated_at = clock_timestamp()
        WHERE job_id = job AND lease_token = token AND status = 'running';
    END IF;
    IF NOT FOUND THEN  -- re-armed or taken over since the read above (the token is the fence)
        RETURN false;
    END IF;
    IF NOT succeeded THEN  -- for good: the on_failure hook owed, the radix_events event (hooks.sql)
        PERFORM radix._failed_for_good(s, error);
    END IF;
    IF EXISTS (SELECT 1 FROM radix.job_edges e WHERE e.upstream_id = job) THEN
        PERFORM radix._fire_dependents(job, s.planned_ns, coalesce(s.request_kind, 'schedule'), succeeded);
    END IF;
    PERFORM radix._promote_request(job);
    RETURN true;
END $$;

-- A lease attempt's outcome, as its node reports it: the history row, then retry_wait or the next tick.
-- An attempt whose lease was lost by a re-arm (its token is the fence) clears the fence when
-- its node reports it ended, so the job's next attempt may start.
CREATE OR REPLACE FUNCTION radix.finish_attempt(job uuid, token uuid, outcome text, error jsonb,
                                                retry_delay_ns bigint, next_planned_ns bigint,
                                                atomic boolean, mark_non_atomic boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
    IF mark_non_atomic AND s.request_kind IS DISTINCT FROM 'on_failure' THEN  -- the hook's, not the job's
        UPDATE radix.jobs SET non_atomic = true WHERE job_id = job AND NOT non_atomic;
    END IF;
    DELETE FROM radix.attempt_frames WHERE job_id = job AND lease_token = token;
    RETURN true;
END $$;

-- An attempt of a tick that could neither commit nor be recorded as a lease: its tick changed under it
-- (ALTER JOB re-armed the job, and the daemon ended it) or another node took the tick after it rolled back.
-- Its history row says so, as the lease path's 'lease_lost' does, with the attempt's own start and end (as
-- the daemon saw them) and the SQLSTATE it ended with; the tick itself is the state's business.
CREATE OR REPLACE FUNCTION radix.record_lost_tick(node text, job uuid, tick_ns bigint, attempt integer, started_at timestamptz,
                                       finished_at timestamptz, sqlstate text)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
    INSERT INTO radix.radix_system_job_history
        (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind, atomic,
         started_at, finished_at, error)
    SELECT j.job_id, j.definition_version, tick_ns, attempt, job::text || '/' || tick_ns::text, 'lease_lost', node,
           'schedule', true, least(started_at, clock_timestamp()), least(finished_at, clock_timestamp()),
           radix._lease_lost(jsonb_build_object('reason', 'tick changed or taken over', 'sqlstate', sqlstate))
    FROM radix.jobs j WHERE j.job_id = job;
    SELECT radix._prune_history(job);
$$;

CREATE OR REPLACE FUNCTION radix._prune_history(job uuid) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    DELETE FROM radix.radix_system_job_history h
    WHERE h.job_id = _prune_history.job AND h.history_id <= (
        SELECT o.history_id FROM radix.radix_system_job_history o WHERE o.job_id = _prune_history.job
        ORDER BY o.history_id DESC
        OFFSET (SELECT j.history_limit FROM radix.jobs j WHERE j.job_id = _prune_history.job) LIMIT 1);
END $$;
