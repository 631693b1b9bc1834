-- 0007: fair claims. One principal's due work can no longer take every slot: a claim gives each principal
-- (the RUN AS role) at most `max_per_principal` running attempts in the database, counted across all
-- nodes, and shares the slots it has round-robin among the principals with due work: fewest running
-- first, then oldest due tick. Claims serialise on one radix-owned row (no other role can lock it), so
-- the count a claim decides on is exact.
--
-- Fairness is per principal, not per job owner: an owner may SET ROLE to each principal it schedules as,
-- and create jobs owned by that principal, so per-owner shares would give a tenant one share per role it
-- can become plus its own; per principal it gets one share per LOGIN role it may run as, and LOGIN roles
-- are made by whoever administers the cluster. See docs/security.md "Fair claims".

-- The principal of each state row, kept from radix.jobs (a job's principal never changes today; the
-- trigger on radix.jobs keeps it right if that ever does), so due work can be found per principal.
ALTER TABLE radix.radix_system_job_state ADD COLUMN principal_oid oid;
UPDATE radix.radix_system_job_state s SET principal_oid = j.principal_oid FROM radix.jobs j
WHERE j.job_id = s.job_id;
ALTER TABLE radix.radix_system_job_state ALTER COLUMN principal_oid SET NOT NULL;

CREATE FUNCTION radix._state_principal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.principal_oid := (SELECT j.principal_oid FROM radix.jobs j WHERE j.job_id = NEW.job_id);
    RETURN NEW;
END $$;
CREATE TRIGGER state_principal BEFORE INSERT OR UPDATE OF job_id ON radix.radix_system_job_state
    FOR EACH ROW EXECUTE FUNCTION radix._state_principal();

CREATE FUNCTION radix._job_principal_changed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE radix.radix_system_job_state SET principal_oid = NEW.principal_oid WHERE job_id = NEW.job_id;
    RETURN NULL;
END $$;
CREATE TRIGGER job_principal_changed AFTER UPDATE OF principal_oid ON radix.jobs
    FOR EACH ROW WHEN (OLD.principal_oid IS DISTINCT FROM NEW.principal_oid)
    EXECUTE FUNCTION radix._job_principal_changed();

-- Due work per principal, in due order: the claim reads each principal's earliest ticks from here, and
-- the distinct principals with live rows by a skip scan (two descents per principal).
CREATE INDEX radix_system_job_state_principal_due ON radix.radix_system_job_state (principal_oid, due_ns)
    WHERE status IN ('scheduled', 'running', 'retry_wait');

-- The row every claim locks first (FOR UPDATE): no ordinary role has a privilege on the table, so none
-- can lock it or hold a claim up.
CREATE TABLE radix.claim_serial (only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row));
INSERT INTO radix.claim_serial VALUES (true);
REVOKE ALL ON radix.claim_serial FROM PUBLIC;

-- The principals with live work: their earliest due tick (scheduled / retry_wait, or a running claim's
-- lease expiry) and how many attempts they have running in the database (every node). Cost: a skip scan
-- of radix_system_job_state_principal_due (two descents per principal) and the running rows
-- (radix_system_job_state_running); never the catalog.
CREATE FUNCTION radix._principal_load()
RETURNS TABLE (principal oid, first_due_ns bigint, running integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
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
        SELECT s.principal_oid AS p, count(*)::integer AS n
        FROM radix.radix_system_job_state s WHERE s.status = 'running' GROUP BY s.principal_oid
    )
    SELECT k.p,
           (SELECT s.due_ns FROM radix.radix_system_job_state s
            WHERE s.status IN ('scheduled', 'running', 'retry_wait') AND s.principal_oid = k.p
            ORDER BY s.due_ns LIMIT 1),
           coalesce(b.n, 0)
    FROM keys k LEFT JOIN busy b ON b.p = k.p
    WHERE k.p IS NOT NULL
$$;

-- next_due_in: seconds until the earliest tick a claim with this cap could take (<= 0: now), or NULL
-- when there is none: a principal at its cap has nothing due until one of its attempts ends. While
-- nothing is due it is one probe of radix_system_job_state_due.
CREATE FUNCTION radix.next_due_in(max_per_principal integer) RETURNS float8
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    first bigint := (SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                     WHERE s.status IN ('scheduled', 'running', 'retry_wait'));
BEGIN
    IF first IS NULL OR first > now_ns OR coalesce(max_per_principal, 0) <= 0 THEN
        RETURN (first - now_ns) / 1e9;
    END IF;
    RETURN (SELECT (min(l.first_due_ns) - now_ns) / 1e9 FROM radix._principal_load() l
            WHERE l.running < max_per_principal);
END $$;

-- The round-robin of one claim: `budget` slots dealt one at a time, each to the principal with the
-- fewest running attempts (`running`, plus what this deal gave it), ties by its earliest due tick, never
-- past `cap` (NULL: no cap). Returns how many slots each principal got.
CREATE FUNCTION radix._claim_shares(principals oid[], running integer[], first_due bigint[],
                                    budget integer, cap integer)
RETURNS TABLE (principal oid, share integer)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT x.p, count(*)::integer
    FROM (SELECT u.p
          FROM unnest(principals, running, first_due) AS u(p, n, due)
          CROSS JOIN LATERAL generate_series(1, least(budget, coalesce(cap - u.n, budget))) AS g(i)
          ORDER BY u.n + g.i, u.due, u.p
          LIMIT greatest(budget, 0)) x
    GROUP BY x.p
$$;

-- claim_due: claim up to `max_claims` ticks for `node`. Claimable: the claims of dead nodes (running,
-- their node's control session gone), then due rows (scheduled / retry_wait with due_ns <= now, or
-- running with an expired lease); never a job with a committed frame whose backend still runs, and
-- never a row locked by a running atomic attempt (KEY SHARE) or another claimer (SKIP LOCKED).
-- Fair: the slots are dealt round-robin among the principals with due work (radix._claim_shares:
-- fewest running attempts first, then earliest due tick), each principal's rows in due order; a
-- principal with `max_per_principal` attempts running in the database (every node) gets none (NULL or
-- 0: no cap). A principal with fewer claimable rows than its share is done, and what is left of the
-- budget is dealt again among the others. Resumed claims of dead nodes already count as running.
-- Claims serialise on radix.claim_serial, so two nodes never both fill one cap.
-- With `with_cron` false, cron ticks are left alone (the engine plans them first, see planning.py).
-- Missed interval ticks coalesce to the latest due one (counted) when a fresh tick starts; a resumed
-- claim keeps its planned time, attempt number and idempotency key. Each claim writes the state and a
-- 'running' history row together.
-- Cost: index scans only. Nothing due: one probe of radix_system_job_state_due. Due work: a skip scan
-- over the principals with live rows (radix._principal_load), then per principal an ordered scan of
-- radix_system_job_state_principal_due that stops at its share; running rows by
-- radix_system_job_state_running; node liveness only when another node holds a running claim.
DROP FUNCTION radix.claim_due(text, integer, boolean);
CREATE FUNCTION radix.claim_due(node text, max_claims integer, with_cron boolean DEFAULT true,
                                max_per_principal integer DEFAULT NULL)
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
                  AND (with_cron OR NOT EXISTS (
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

    RETURN QUERY
    WITH decided AS (
        SELECT s.job_id, s.status = 'running' AS resumed,
               CASE WHEN s.status = 'scheduled' AND j.schedule_kind = 'every' AND s.planned_ns <= now_ns
                    THEN s.planned_ns + (now_ns - s.planned_ns) / j.interval_ns * j.interval_ns
                    ELSE s.planned_ns END AS new_planned,
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
            lease_expires_at = now_ts + interval '5 minutes',
            due_ns = radix.to_ns(now_ts + interval '5 minutes'),
            coalesced_ticks = s.coalesced_ticks + CASE WHEN d.schedule_kind = 'every'
                THEN (d.new_planned - d.old_planned) / d.interval_ns ELSE 0 END,
            updated_at = now_ts
        FROM decided d WHERE s.job_id = d.job_id
        RETURNING s.job_id, s.definition_version, s.lease_token, s.planned_ns, s.attempt,
                  s.idempotency_key, d.resumed,
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
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node)
        SELECT c.job_id, c.definition_version, c.planned_ns, c.attempt, c.idempotency_key, 'running', node
        FROM claimed c WHERE NOT c.resumed
        RETURNING 1
    )
    SELECT c.job_id, c.definition_version, c.lease_token, c.planned_ns, c.attempt, c.idempotency_key,
           c.resumed, c.coalesced, c.anchor_ns
    FROM claimed c;

    -- resumed claims: the lost row was closed above; the new attempt gets its own row
    IF resuming THEN
        INSERT INTO radix.radix_system_job_history
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node)
        SELECT s.job_id, s.definition_version, s.planned_ns, s.attempt, s.idempotency_key, 'running', node
        FROM unnest(picked) AS p(job_id) JOIN radix.radix_system_job_state s ON s.job_id = p.job_id
        WHERE s.lease_node = node AND s.status = 'running' AND s.updated_at = now_ts
          AND NOT EXISTS (SELECT 1 FROM radix.radix_system_job_history h
                          WHERE h.job_id = s.job_id AND h.planned_ns = s.planned_ns
                            AND h.attempt = s.attempt AND h.status = 'running');
    END IF;
    -- keep at most 256 history rows per job
    DELETE FROM radix.radix_system_job_history h USING unnest(picked) AS p(job_id)
    WHERE h.job_id = p.job_id AND h.history_id <= (
        SELECT o.history_id FROM radix.radix_system_job_history o WHERE o.job_id = p.job_id
        ORDER BY o.history_id DESC OFFSET 256 LIMIT 1);
END $$;

REVOKE ALL ON FUNCTION radix.claim_due(text, integer, boolean, integer), radix.next_due_in(integer),
    radix._principal_load(), radix._claim_shares(oid[], integer[], bigint[], integer, integer),
    radix._state_principal(), radix._job_principal_changed() FROM PUBLIC;
