-- The finder: which ticks are due, and the fair share of slots each principal gets.

CREATE OR REPLACE FUNCTION radix._principal_load()
RETURNS TABLE (principal oid, first_due_ns bigint, running integer)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH RECURSIVE keys(p) AS (
        (SELECT s.principal_oid FROM radix.radix_system_job_state s
         WHERE s.status IN ('scheduled', 'running', 'retry_wait')
         ORDER BY s.principal_oid LIMIT 1)
        UNION ALL
        SELECT (SELECT s.principal_oid FROM radix.radix_system_job_state s
                WHERE s.status IN ('scheduled', 'running', 'retry_wait') AND s.principal_oid > k.p
                ORDER BY s.principal_oid LIMIT 1)
        FROM keys k WHERE k.p IS NOT NULL
    ), busy AS (
        -- a principal's attempts running in the database: claims and published ticks, and document runs
        SELECT x.p, sum(x.n)::integer AS n FROM (
            SELECT s.principal_oid AS p, count(*) AS n
            FROM radix.radix_system_job_state s WHERE s.status = 'running' GROUP BY s.principal_oid
            UNION ALL
            SELECT c.principal_oid, count(*)
            FROM radix.cron_table c WHERE c.sys_process_id IS NOT NULL GROUP BY c.principal_oid) x
        GROUP BY x.p
    )
    SELECT k.p,
           (SELECT s.due_ns FROM radix.radix_system_job_state s
            WHERE s.status IN ('scheduled', 'running', 'retry_wait') AND s.principal_oid = k.p
            ORDER BY s.due_ns LIMIT 1),
           coalesce(b.n, 0)
    FROM keys k LEFT JOIN busy b ON b.p = k.p
    WHERE k.p IS NOT NULL;
END $$;

CREATE OR REPLACE FUNCTION radix._running_elsewhere(node text, mine integer[])
RETURNS TABLE (principal oid, running integer)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT x.p, sum(x.n)::integer FROM (
        SELECT s.principal_oid AS p, count(*) AS n
        FROM radix.radix_system_job_state s WHERE s.status = 'running' AND s.lease_node <> node
        GROUP BY s.principal_oid
        UNION ALL
        -- document runs of other nodes in a CSP worker (a DB_FUNCTION's session is counted below)
        SELECT c.principal_oid, count(*)
        FROM radix.cron_table c JOIN radix.sys_processes p ON p.id = c.sys_process_id
        WHERE c.sys_process_id IS NOT NULL AND p.status = 'running' AND p.type = 'csp' AND p.node <> _running_elsewhere.node
        GROUP BY c.principal_oid
        UNION ALL
        SELECT a.usesysid, count(*)
        FROM pg_stat_get_activity(NULL) a
        WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
          AND a.application_name = 'radixjobs-attempt' AND a.state IN ('active', 'idle in transaction')
          AND a.pid <> ALL (coalesce(mine, '{}'))
          AND NOT EXISTS (SELECT 1 FROM radix.attempt_frames f WHERE f.pid = a.pid)
        GROUP BY a.usesysid) x
    GROUP BY x.p;
END $$;

-- Does state row `s` wait for a place in its group (one of `full_groups`, radix._full_groups)? A running
-- row never does: its claim holds its place (or, expired, is taken over in it). Plain SQL without a SET
-- clause, every name qualified: inlined into claim_due's scan, where it costs nothing while no group is full.
CREATE OR REPLACE FUNCTION radix._waits_for_group(s radix.radix_system_job_state, full_groups bigint[])
RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.cardinality(full_groups) OPERATOR(pg_catalog.>) 0
       AND s.status OPERATOR(pg_catalog.<>) 'running'
       AND EXISTS (SELECT 1 FROM radix.jobs j
                   WHERE j.job_id OPERATOR(pg_catalog.=) s.job_id
                     AND j.group_id OPERATOR(pg_catalog.=) ANY (full_groups));

CREATE OR REPLACE FUNCTION radix.lease_work_due(node text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    full_groups bigint[] := radix._full_groups();
BEGIN
    RETURN coalesce((SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                     WHERE s.status IN ('scheduled', 'running', 'retry_wait')
                       AND (s.via_lease OR s.request_kind IS NOT NULL OR s.status = 'running')
                       AND NOT radix._waits_for_group(s, full_groups))
                    <= radix.to_ns(clock_timestamp()), false)
        OR EXISTS (SELECT 1 FROM radix.radix_system_job_state s
                   WHERE s.status = 'running' AND s.lease_node <> node AND NOT radix.node_alive(s.lease_node));
END $$;

CREATE OR REPLACE FUNCTION radix.job_has_live_frame(job uuid) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM radix.attempt_frames f
                   WHERE f.job_id = job_has_live_frame.job AND EXISTS (
                       SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start));
END $$;

-- The round-robin of one claim: `budget` slots dealt one at a time, each to the principal with the fewest
-- running attempts (`running`, plus what this deal gave it), ties first to the principal found latest in
-- `served` (absent: first), then by its earliest due tick; never past `cap` (NULL: no cap).
CREATE OR REPLACE FUNCTION radix._claim_shares(principals oid[], running integer[], first_due bigint[],
                                    budget integer, cap integer, served oid[] DEFAULT NULL)
RETURNS TABLE (principal oid, share integer)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT x.p, count(*)::integer
    FROM (SELECT u.p
          FROM unnest(principals, _claim_shares.running, first_due) AS u(p, n, due)
          LEFT JOIN unnest(served) WITH ORDINALITY AS v(p, turn) ON v.p = u.p
          CROSS JOIN LATERAL generate_series(1, least(budget, coalesce(cap - u.n, budget))) AS g(i)
          ORDER BY u.n + g.i, v.turn NULLS FIRST, u.due, u.p
          LIMIT greatest(budget, 0)) x
    GROUP BY x.p;
END $$;

-- Seconds until the earliest tick a claim with this cap could take (<= 0: now), or NULL when there is none:
-- a principal at its cap has nothing due until one of its attempts ends, nor has a group with no free place
-- (radix._full_groups). With `long_ms`, only ticks of
-- jobs whose timeout is at most that count, looked for among each principal's first 16 live ticks (one
-- whose first 16 are all long waits for an attempt to end, a notification or the poll). While nothing is
-- due it is one probe of radix_system_job_state_due.
CREATE OR REPLACE FUNCTION radix.next_due_in(max_per_principal integer, long_ms integer DEFAULT NULL) RETURNS float8
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    cap integer := nullif(greatest(max_per_principal, 0), 0);
    full_groups bigint[] := radix._full_groups();
    first bigint := CASE WHEN cardinality(full_groups) = 0
                         THEN (SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                               WHERE s.status IN ('scheduled', 'running', 'retry_wait'))
                         ELSE (SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                               WHERE s.status IN ('scheduled', 'running', 'retry_wait')
                                 AND NOT radix._waits_for_group(s, full_groups)) END;
BEGIN
    IF first IS NULL OR first > now_ns OR (cap IS NULL AND long_ms IS NULL) THEN
        RETURN (first - now_ns) / 1e9;
    END IF;
    -- (a principal's first due tick may wait for its group: never sooner than `first`; NULL stays NULL)
    IF long_ms IS NULL THEN
        RETURN (SELECT (min(l.first_due_ns) + greatest(first - min(l.first_due_ns), 0) - now_ns) / 1e9
                FROM radix._principal_load() l
                WHERE l.running < cap);
    END IF;
    RETURN (SELECT (min(x.due_ns) + greatest(first - min(x.due_ns), 0) - now_ns) / 1e9
            FROM radix._principal_load() l
            CROSS JOIN LATERAL (
                SELECT w.due_ns
                FROM (SELECT s.job_id, s.due_ns FROM radix.radix_system_job_state s
                      WHERE s.principal_oid = l.principal AND s.status IN ('scheduled', 'running', 'retry_wait')
                      ORDER BY s.due_ns LIMIT 16) w
                JOIN radix.jobs j ON j.job_id = w.job_id
                WHERE j.deadline_ms <= long_ms
                ORDER BY w.due_ns LIMIT 1) x
            WHERE cap IS NULL OR l.running < cap);
END $$;

CREATE OR REPLACE FUNCTION radix.claim_due(node text, max_claims integer, with_cron boolean DEFAULT true,
                                max_per_principal integer DEFAULT NULL, lease_seconds integer DEFAULT 300,
                                leave_ticks boolean DEFAULT false, long_ms integer DEFAULT NULL,
                                max_long integer DEFAULT NULL, served oid[] DEFAULT NULL)
RETURNS TABLE (job_id uuid, definition_version bigint, lease_token uuid, planned_ns bigint,
               attempt integer, idempotency_key text, resumed boolean, coalesced bigint,
               anchor_ns bigint, run_kind text)
LANGUAGE plpgsql VOLATILE ROWS 16
SET search_path = pg_catalog, pg_temp
-- the statements' plans do not depend on the values (index scans by key, ordered by due_ns); custom
-- plans were re-made at every call (~0.8 ms, most of a claim's cost)
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    now_ts timestamptz := clock_timestamp();
    now_ns bigint := radix.to_ns(now_ts);
    lease interval := make_interval(secs => greatest(coalesce(lease_seconds, 300), 1));
    cap integer := nullif(greatest(max_per_principal, 0), 0);
    long_allowed integer := CASE WHEN long_ms IS NOT NULL AND max_long IS NOT NULL THEN greatest(max_long, 0) END;
    long_left integer := long_allowed;  -- long ones this claim may still take (NULL: no limit)
    dead text[] := '{}';
    picked uuid[] := '{}';
    missed uuid[];
    resuming boolean;
    budget integer;
    ps oid[];
    runs integer[];
    ps0 oid[];  -- the principals dealt to, and their running attempts before this claim
    runs0 integer[];
    dues bigint[];
    shares oid[];
    share_counts integer[];
    took_ids uuid[];
    took oid[];
    full_groups bigint[];  -- the job groups with no free place (groups.sql): their due ticks wait
BEGIN
    -- a table lock, not a row lock: no tuple written, no WAL, so a claim that finds nothing commits nothing
    LOCK TABLE radix.claim_serial IN EXCLUSIVE MODE;
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
              AND (long_left IS NULL OR long_left > 0 OR EXISTS (
                      SELECT 1 FROM radix.jobs j WHERE j.job_id = s.job_id AND j.deadline_ms <= long_ms))
            ORDER BY s.due_ns
            LIMIT max_claims
            FOR UPDATE SKIP LOCKED);
        IF long_left IS NOT NULL THEN
            long_left := long_left - (SELECT count(*)::integer FROM radix.jobs j
                                      WHERE j.job_id = ANY (picked) AND j.deadline_ms > long_ms);
        END IF;
    END IF;
    budget := max_claims - cardinality(picked);
    full_groups := radix._full_groups();
    -- min(): an index probe of radix_system_job_state_due whatever the generic plan thinks of due_ns <= now
    IF budget > 0 AND (SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                       WHERE s.status IN ('scheduled', 'retry_wait', 'running')) <= now_ns THEN
        SELECT coalesce(array_agg(l.principal), '{}'), coalesce(array_agg(l.running), '{}'),
               coalesce(array_agg(l.first_due_ns), '{}')
        INTO ps, runs, dues
        FROM radix._principal_load() l
        WHERE l.first_due_ns <= now_ns AND (cap IS NULL OR l.running < cap);
        ps0 := ps;
        runs0 := runs;
        -- every round ends the claim or drops a principal (done or at its cap): at most one per principal
        FOR deal IN 1 .. cardinality(ps) LOOP
            EXIT WHEN budget <= 0 OR cardinality(ps) = 0;
            SELECT array_agg(sh.principal), array_agg(sh.share) INTO shares, share_counts
            FROM radix._claim_shares(ps, runs, dues, budget, cap, served) sh;
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
                  -- the daemon runs the one-transaction path's ticks itself (radix.find_ticks)
                  AND (NOT leave_ticks OR s.via_lease OR s.request_kind IS NOT NULL OR s.status = 'running')
                  AND (s.fence_token IS NULL OR NOT radix.node_alive(s.fence_node))
                  AND NOT radix._waits_for_group(s, full_groups)
                  AND (with_cron OR s.request_kind IS NOT NULL OR NOT EXISTS (
                          SELECT 1 FROM radix.jobs j WHERE j.job_id = s.job_id AND j.schedule_kind = 'cron'))
                  -- no long attempt left to take: the short ones only
                  AND (long_left IS NULL OR long_left > 0 OR EXISTS (
                          SELECT 1 FROM radix.jobs j WHERE j.job_id = s.job_id AND j.deadline_ms <= long_ms))
                  AND NOT EXISTS (
                      SELECT 1 FROM radix.attempt_frames f
                      WHERE f.job_id = s.job_id AND EXISTS (
                          SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start))
                ORDER BY s.due_ns
                LIMIT q.n
                FOR UPDATE OF s SKIP LOCKED) c;
            picked := picked || took_ids;
            budget := budget - cardinality(took_ids);
            IF long_left IS NOT NULL AND cardinality(took_ids) > 0 THEN
                long_left := long_left - (SELECT count(*)::integer FROM radix.jobs j
                                          WHERE j.job_id = ANY (took_ids) AND j.deadline_ms > long_ms);
            END IF;
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
    IF long_left < 0 THEN
        -- a round took more long ones than were left: the long ones kept are dealt as the slots were, by
        -- their principals' running attempts plus what this claim gave them before, then `served`
        picked := ARRAY(
            WITH x AS (
                SELECT p.id, p.i, j.deadline_ms > long_ms AS long, s.principal_oid AS pr
                FROM unnest(picked) WITH ORDINALITY AS p(id, i)
                JOIN radix.jobs j ON j.job_id = p.id
                JOIN radix.radix_system_job_state s ON s.job_id = p.id
            ), leveled AS (
                SELECT x.*, coalesce(u.n, 0) + row_number() OVER (PARTITION BY x.pr ORDER BY x.i) AS level
                FROM x LEFT JOIN unnest(ps0, runs0) AS u(p, n) ON u.p = x.pr
            ), ranked AS (
                SELECT l.*, row_number() OVER (PARTITION BY l.long ORDER BY l.level,
                                               array_position(served, l.pr) NULLS FIRST, l.i) AS nth
                FROM leveled l
            )
            SELECT r.id FROM ranked r WHERE NOT r.long OR r.nth <= long_allowed ORDER BY r.i);
    END IF;
    -- at most each group's free places (claim_serial held: no other claim counts them meanwhile)
    IF EXISTS (SELECT 1 FROM radix.jobs j WHERE j.job_id = ANY (picked) AND j.group_id IS NOT NULL) THEN
        picked := radix._within_group_caps(picked);
    END IF;
    -- a tick past its start deadline is recorded missed, not claimed (its state row is locked above)
    IF EXISTS (SELECT 1 FROM radix.jobs j WHERE j.job_id = ANY (picked) AND j.start_deadline_ns IS NOT NULL) THEN
        missed := radix._skip_missed(node, picked, now_ns);
        picked := ARRAY(SELECT p.id FROM unnest(picked) WITH ORDINALITY AS p(id, i) WHERE p.id <> ALL (missed)
                        ORDER BY p.i);
    END IF;
    IF cardinality(picked) = 0 THEN
        RETURN;
    END IF;
    resuming := cardinality(dead) > 0 OR EXISTS (
        SELECT 1 FROM radix.radix_system_job_state s WHERE s.job_id = ANY (picked) AND s.status = 'running');

    -- fresh claims: a history row still 'running' for the job belongs to no attempt (its state is not
    -- running); close it before the new attempt's row is written
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = now_ts,
        error = radix._lease_lost(jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = ANY (picked) AND h.status = 'running'  -- radix_system_job_history_running
      AND NOT EXISTS (SELECT 1 FROM radix.radix_system_job_state s
                      WHERE s.job_id = h.job_id AND s.status = 'running');

    RETURN QUERY
    WITH decided AS (
        SELECT s.job_id, s.status = 'running' AS resumed,
               CASE WHEN s.status = 'scheduled' AND j.schedule_kind = 'every' AND s.planned_ns <= now_ns
                         AND s.request_kind IS NULL
                    THEN radix._tick_to_run(s.planned_ns, now_ns, j.interval_ns, j.coalesce_ticks, s.job_id,
                                            j.jitter_ns)
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
            coalesced_ticks = s.coalesced_ticks
                              + radix._ticks_coalesced(d.schedule_kind, d.old_planned, d.new_planned, d.interval_ns),
            updated_at = now_ts
        FROM decided d WHERE s.job_id = d.job_id
        RETURNING s.job_id, s.definition_version, s.lease_token, s.planned_ns, s.attempt,
                  s.idempotency_key, d.resumed, d.run_kind,
                  radix._ticks_coalesced(d.schedule_kind, d.old_planned, d.new_planned, d.interval_ns) AS coalesced,
                  s.anchor_ns
    ), lost AS (
        UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = now_ts,
            error = radix._lease_lost(jsonb_build_object('scheduler_retryable', true))
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
           c.resumed, c.coalesced, c.anchor_ns, c.run_kind
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

-- find_ticks: up to `max_ticks` ticks due within `horizon_ms`, none of `skip` (running here), dealt among the
-- principals as radix._claim_shares deals a claim's slots, ties to the principal served least recently by this
-- node (`served`, least recently first, as radix.claim_due's): under a backlog the slots a find cannot deal
-- evenly go to each principal in turn, not always to the same ones.
CREATE OR REPLACE FUNCTION radix.find_ticks(node text, max_ticks integer, horizon_ms integer, skip uuid[], mine integer[],
                                            served oid[] DEFAULT NULL)
RETURNS TABLE (job_id uuid, definition_version bigint, planned_ns bigint, attempt integer, coalesced bigint,
               anchor_ns bigint, due_in_ms float8, token uuid, principal oid, elsewhere integer,
               deadline_ms integer)
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
    -- ticks past their start deadline are recorded missed, not found (a probe of jobs_start_deadline when none has one)
    IF EXISTS (SELECT 1 FROM radix.jobs j WHERE j.start_deadline_ns IS NOT NULL) THEN
        PERFORM radix._sweep_missed(node, now_ns);
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
        SELECT sh.principal AS p, sh.share AS n FROM radix._claim_shares(ps, runs, dues, max_ticks, NULL, served) sh
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
        SELECT f.*, j.interval_ns, j.schedule_kind, j.deadline_ms,
               CASE WHEN f.status = 'scheduled' AND j.schedule_kind = 'every' AND f.planned_ns <= now_ns
                    THEN radix._tick_to_run(f.planned_ns, now_ns, j.interval_ns, j.coalesce_ticks, f.job_id,
                                            j.jitter_ns)
                    ELSE f.planned_ns END AS run_ns
        -- one probe of the jobs' primary key per tick found (see the header)
        FROM found f CROSS JOIN LATERAL (
            SELECT jj.interval_ns, jj.schedule_kind, jj.coalesce_ticks, jj.deadline_ms, jj.jitter_ns FROM radix.jobs jj
            WHERE jj.job_id = f.job_id LIMIT 1) j
    )
    SELECT d.job_id, d.definition_version, d.run_ns, d.attempt + 1,
           radix._ticks_coalesced(d.schedule_kind, d.planned_ns, d.run_ns, d.interval_ns),
           d.anchor_ns, (greatest(d.due_ns - radix.to_ns(clock_timestamp()), 0) / 1e6)::float8,
           radix._token_of(k.secret, d.job_id, d.run_ns, d.attempt, d.updated_at),
           d.principal_oid,
           coalesce(runs[array_position(ps, d.principal_oid)], 0),
           d.deadline_ms
    FROM decided d CROSS JOIN radix.attempt_secret k
    ORDER BY d.due_ns;
END $$;
