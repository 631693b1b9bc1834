-- 0020: radix.find_ticks says how long until each tick is due as of the end of the find, not its start, and
-- its commit does not wait for a WAL flush.
--
-- The engine starts a found tick at the monotonic time the find's answer came back plus `due_in_ms`
-- (engine/ticks.py, Tick.from_row). Measured from the find's start, `due_in_ms` left out the find's own
-- time and its way back, and every tick found ahead started that much late (more under load). Measured at
-- the end, it is late only by the rest of the find and the answer's way back (the engine takes off the
-- time of the query pipelined after it: engine/runner.py, AFTER_FIND), and never early: radix.start_tick
-- refuses a tick that arrives before it is due. And its transaction commits without
-- waiting for the WAL flush of its row locks (synchronous_commit off, for that transaction only): a find
-- keeps nothing a crash could lose but an installed request, which is then installed again by the next.
-- The rest of the function is 0014's.

CREATE OR REPLACE FUNCTION radix.find_ticks(node text, max_ticks integer, horizon_ms integer, skip uuid[], mine integer[])
RETURNS TABLE (job_id uuid, definition_version bigint, planned_ns bigint, attempt integer, coalesced bigint,
               anchor_ns bigint, due_in_ms float8, token uuid, principal oid, elsewhere integer)
LANGUAGE plpgsql VOLATILE ROWS 64
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    until_ns bigint := now_ns + greatest(coalesce(horizon_ms, 0), 0)::bigint * 1000000;
    ps oid[];
    runs integer[];
    dues bigint[];
BEGIN
    -- the find's transaction keeps nothing: its commit need not wait for the WAL of its row locks
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    -- a request queued while a tick held its job (radix._promote_request left it) is installed now
    IF EXISTS (SELECT 1 FROM radix.job_requests) THEN
        PERFORM radix._promote_request(q.job_id)
        FROM (SELECT DISTINCT r.job_id FROM radix.job_requests r) q
        JOIN radix.radix_system_job_state s ON s.job_id = q.job_id
        WHERE s.request_kind IS NULL AND s.status NOT IN ('running', 'retry_wait');
    END IF;
    IF coalesce(max_ticks, 0) <= 0
       OR NOT coalesce((SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                        WHERE s.status IN ('scheduled', 'running', 'retry_wait')) <= until_ns, false) THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(l.principal), '{}'), coalesce(array_agg(coalesce(e.running, 0)), '{}'),
           coalesce(array_agg(l.first_due_ns), '{}')
    INTO ps, runs, dues
    FROM radix._principal_load() l
    LEFT JOIN radix._running_elsewhere(node, mine) e ON e.principal = l.principal
    WHERE l.first_due_ns <= until_ns;
    IF cardinality(ps) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH shares AS (
        SELECT sh.principal AS p, sh.share AS n FROM radix._claim_shares(ps, runs, dues, max_ticks, NULL) sh
        WHERE cardinality(ps) > 1
        UNION ALL
        SELECT ps[1], max_ticks WHERE cardinality(ps) = 1
    ), found AS (
        SELECT c.* FROM shares q
        CROSS JOIN LATERAL (
            SELECT s.job_id, s.definition_version, s.planned_ns, s.attempt, s.due_ns, s.status, s.anchor_ns,
                   s.updated_at, s.principal_oid
            FROM radix.radix_system_job_state s
            JOIN radix.tick_locks t ON t.job_id = s.job_id
            WHERE s.principal_oid = q.p
              AND s.status IN ('scheduled', 'retry_wait') AND s.due_ns <= until_ns
              AND s.planned_ns IS NOT NULL AND NOT s.via_lease AND s.request_kind IS NULL
              AND s.job_id <> ALL (coalesce(skip, '{}'))
              AND (s.fence_token IS NULL OR NOT radix.node_alive(s.fence_node))
              -- radix.job_has_live_frame(s.job_id), inlined as claim_due does (a call per candidate row)
              AND NOT EXISTS (
                  SELECT 1 FROM radix.attempt_frames f
                  WHERE f.job_id = s.job_id AND EXISTS (
                      SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start))
            ORDER BY s.due_ns
            LIMIT q.n
            FOR UPDATE OF t SKIP LOCKED) c
    ), decided AS (
        SELECT f.*, j.interval_ns, j.schedule_kind,
               CASE WHEN f.status = 'scheduled' AND j.schedule_kind = 'every' AND f.planned_ns <= now_ns
                    THEN f.planned_ns + greatest(
                             (now_ns - f.planned_ns) / j.interval_ns
                             - CASE WHEN j.coalesce_ticks THEN 0 ELSE radix.max_missed_ticks() - 1 END,
                             0) * j.interval_ns
                    ELSE f.planned_ns END AS run_ns
        -- one probe of the jobs' primary key per tick found (see the header)
        FROM found f CROSS JOIN LATERAL (
            SELECT jj.interval_ns, jj.schedule_kind, jj.coalesce_ticks FROM radix.jobs jj
            WHERE jj.job_id = f.job_id LIMIT 1) j
    )
    SELECT d.job_id, d.definition_version, d.run_ns, d.attempt + 1,
           CASE WHEN d.schedule_kind = 'every' THEN (d.run_ns - d.planned_ns) / d.interval_ns ELSE 0 END,
           d.anchor_ns, (greatest(d.due_ns - radix.to_ns(clock_timestamp()), 0) / 1e6)::float8,
           -- radix._tick_token(d.job_id, d.run_ns, d.attempt, d.updated_at), inlined (see the header)
           encode(substring(sha256(k.secret || uuid_send(d.job_id) || int8send(d.run_ns) || int4send(d.attempt)
                                   || timestamptz_send(d.updated_at)) FROM 1 FOR 16), 'hex')::uuid,
           d.principal_oid,
           coalesce(runs[array_position(ps, d.principal_oid)], 0)
    FROM decided d CROSS JOIN radix.attempt_secret k
    ORDER BY d.due_ns;
END $$;
