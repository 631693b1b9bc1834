-- Start deadlines and jitter: when a tick becomes due (WITH (jitter = …)) and when it may no longer start
-- (WITH (start_deadline = …)). A tick past its deadline is not run: it is recorded 'missed' and its job moves
-- on to its next tick. The deadline applies to a tick's first attempt only (a scheduled tick, attempt 0): a
-- retry, a resumed lease and a RUN JOB or backfill request are never missed.

-- The offset of tick `tick_ns` of job `job` from its planned time under WITH (jitter = …): in [0, jitter_ns),
-- the same wherever and whenever it is computed (a hash of the tick's idempotency key); 0 without jitter.
-- Plain SQL, inlined into the statements that set a tick's due time.
CREATE OR REPLACE FUNCTION radix._jitter_ns(job uuid, tick_ns bigint, jitter_ns bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN jitter_ns IS NULL OR tick_ns IS NULL THEN 0
            ELSE mod(mod(hashtextextended(job::text || '/' || tick_ns::text, 0), jitter_ns) + jitter_ns, jitter_ns)
       END;

-- Tick `tick_ns` of a job WITH (start_deadline = deadline_ns) can no longer start at `now_ns`: it is later than
-- the deadline after the tick's start time (its planned time plus its jitter offset). False without a
-- deadline. Plain SQL, inlined where a tick is started.
CREATE OR REPLACE FUNCTION radix._tick_missed(job uuid, tick_ns bigint, jitter_ns bigint, deadline_ns bigint,
                                              now_ns bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(deadline_ns IS NOT NULL
                AND now_ns - deadline_ns - radix._jitter_ns(job, tick_ns, jitter_ns) > tick_ns, false);

-- Record the missed ticks of `jobs` (the caller holds their tick locks or state rows) at `now_ns`, and
-- return the jobs that had one. For each scheduled, due tick of a job with a start deadline: the tick it
-- would run (an EVERY job's missed ticks coalesced first, radix._tick_to_run, and counted) and, with
-- coalesce = off, each later one, while past its deadline, get a history row 'missed' (attempt 0, no
-- attempt run); the job is then at the next tick (an AT job ends, failed; a CRON job is planned again, from
-- the missed tick, by the daemon).
CREATE OR REPLACE FUNCTION radix._skip_missed(node text, jobs uuid[], now_ns bigint) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    skipped uuid[];
BEGIN
    WITH decided AS (
        SELECT s.job_id, s.planned_ns AS old_ns, j.schedule_kind, j.interval_ns, j.jitter_ns,
               j.start_deadline_ns,
               CASE WHEN j.schedule_kind = 'every'
                    THEN radix._tick_to_run(s.planned_ns, now_ns, j.interval_ns, j.coalesce_ticks, s.job_id,
                                            j.jitter_ns)
                    ELSE s.planned_ns END AS run_ns
        FROM radix.radix_system_job_state s JOIN radix.jobs j ON j.job_id = s.job_id
        WHERE s.job_id = ANY (jobs) AND j.job_id = ANY (jobs) AND j.start_deadline_ns IS NOT NULL
          AND s.status = 'scheduled' AND s.request_kind IS NULL AND s.planned_ns IS NOT NULL
          AND s.due_ns <= now_ns
    ), missed AS (
        -- the ticks past their deadline are the first ones from run_ns on (jitter < interval keeps them in order)
        SELECT d.*, g.tick_ns
        FROM decided d
        CROSS JOIN LATERAL generate_series(d.run_ns,
                                           CASE WHEN d.schedule_kind = 'every' THEN now_ns ELSE d.run_ns END,
                                           coalesce(d.interval_ns, 1)) AS g(tick_ns)
        WHERE radix._tick_missed(d.job_id, g.tick_ns, d.jitter_ns, d.start_deadline_ns, now_ns)
    ), last AS (
        SELECT DISTINCT ON (m.job_id) m.* FROM missed m ORDER BY m.job_id, m.tick_ns DESC
    ), advanced AS (
        UPDATE radix.radix_system_job_state s SET
            status = CASE WHEN l.schedule_kind = 'cron' THEN 'scheduled' ELSE a.status END,
            planned_ns = CASE WHEN l.schedule_kind = 'cron' THEN NULL ELSE a.planned_ns END,
            due_ns = CASE WHEN l.schedule_kind = 'cron' THEN now_ns ELSE a.due_ns END,
            anchor_ns = CASE WHEN l.schedule_kind = 'cron' THEN l.tick_ns ELSE s.anchor_ns END,
            attempt = 0,
            idempotency_key = a.idempotency_key,
            coalesced_ticks = s.coalesced_ticks
                              + radix._ticks_coalesced(l.schedule_kind, l.old_ns, l.run_ns, l.interval_ns),
            last_error = CASE WHEN a.status = 'failed' AND l.schedule_kind = 'at'
                              THEN radix._missed_error(l.start_deadline_ns) ELSE s.last_error END,
            updated_at = clock_timestamp()
        FROM last l
        CROSS JOIN LATERAL radix._advanced(l.schedule_kind,
                                           CASE WHEN l.schedule_kind = 'every' THEN l.tick_ns + l.interval_ns END,
                                           false, l.tick_ns, 0, l.job_id::text || '/' || l.tick_ns::text,
                                           l.job_id, l.jitter_ns) a
        WHERE s.job_id = ANY (jobs) AND s.job_id = l.job_id AND s.status = 'scheduled'
          AND s.request_kind IS NULL AND s.planned_ns = l.old_ns  -- still the state decided on
        RETURNING s.job_id, s.definition_version
    ), recorded AS (
        INSERT INTO radix.radix_system_job_history
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind,
             started_at, finished_at, error)
        SELECT m.job_id, a.definition_version, m.tick_ns, 0, m.job_id::text || '/' || m.tick_ns::text, 'missed',
               node, 'schedule', clock_timestamp(), clock_timestamp(), radix._missed_error(m.start_deadline_ns)
        FROM missed m JOIN advanced a ON a.job_id = m.job_id
        RETURNING 1
    )
    SELECT coalesce(array_agg(a.job_id), '{}') INTO skipped FROM advanced a;
    PERFORM radix._prune_history(u.job) FROM unnest(skipped) AS u(job);
    IF EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = ANY (skipped)) THEN
        PERFORM radix._promote_request(q.job_id)
        FROM (SELECT DISTINCT r.job_id FROM radix.job_requests r WHERE r.job_id = ANY (skipped)) q;
    END IF;
    RETURN skipped;
END $$;

-- The error of a missed tick's history row (and of an AT job whose one tick was missed).
CREATE OR REPLACE FUNCTION radix._missed_error(deadline_ns bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN jsonb_build_object('kind', 'missed', 'start_deadline_ms', deadline_ns / 1000000,
                          'message', 'the tick could not start within its start deadline');

-- The finder's sweep: the due ticks of the one-transaction path past their start deadline, up to 256 (their
-- tick locks taken, skipping any held: a tick being run is not missed), recorded by radix._skip_missed in a
-- later statement (a newer snapshot). The lease path's ticks are checked by radix.claim_due as it claims them.
CREATE OR REPLACE FUNCTION radix._sweep_missed(node text, now_ns bigint) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    locked uuid[];
BEGIN
    locked := ARRAY(
        SELECT t.job_id
        FROM radix.jobs j
        JOIN radix.radix_system_job_state s ON s.job_id = j.job_id
        JOIN radix.tick_locks t ON t.job_id = j.job_id
        WHERE j.start_deadline_ns IS NOT NULL
          AND s.status = 'scheduled' AND s.request_kind IS NULL AND NOT s.via_lease AND s.due_ns <= now_ns
          -- necessary for any tick from planned_ns on to be missed
          AND now_ns - j.start_deadline_ns > s.planned_ns
        LIMIT 256
        -- the state row too: one an open ALTER JOB (or a tick being started) holds is passed by, never waited on
        FOR UPDATE OF t, s SKIP LOCKED);
    IF cardinality(locked) > 0 THEN
        PERFORM radix._skip_missed(node, locked, now_ns);
    END IF;
END $$;
