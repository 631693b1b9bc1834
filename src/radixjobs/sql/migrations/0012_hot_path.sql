-- 0012: the hot path (issue #14). An atomic attempt is one simple-protocol query on the principal's
-- connection, its statements leaner; same checks, same fence, same writes, no foreign-key checks on the
-- hot rows.
--
-- One query. The daemon sends `BEGIN; set_config + begin_atomic; DO (the CALL); end_atomic; COMMIT;` and
-- then the connection's clean as one simple query (one message: psycopg's extended-protocol pipeline cost
-- five times the client CPU). Its text is readable by the procedure (current_query()) and by the principal's other
-- sessions (pg_stat_activity), so it must not carry the lease token, which begin_attempt trusts: it
-- carries a MAC of the token instead, valid only on the backend that runs the attempt:
--   session key  k = sha256(secret || pid || backend_start)        (radix.attempt_session(): this backend's)
--   attempt MAC  m = sha256(k || lease_token)                       (computed by the daemon)
-- The secret (radix.attempt_secret) is readable by radix alone. Both messages have a fixed length, so
-- the secret-prefix hash is a MAC (a length extension yields a longer message, which is never accepted).
-- A MAC read from the text is good for nothing elsewhere: another backend has another session key.
-- On the same backend it is good only while the token lives, and the daemon does not reuse a backend
-- for another attempt before the attempt's tick is recorded (a new token, or none); inside the attempt's
-- own transaction, a forged begin or end destroys or replaces the attempt's frame, so the daemon's
-- end_atomic fails and everything rolls back. tests/security/test_attempt_mac.py attacks each of these.
-- The non-atomic path keeps the bound token (begin_attempt / end_attempt, extended protocol).
--
-- Foreign keys. A history row (inserted by every claim) and a frame row (by every begin) no longer
-- reference radix.jobs. Each of those inserts ran a referential check: a query, and a KEY SHARE lock on
-- the job's row (a heap write and a WAL record per insert, measured at 30-45 us per insert and commit).
-- Only radix's own definer functions write these tables, always for a job whose state row they hold
-- locked, so the check never refused anything. What the ON DELETE CASCADE did, a trigger on radix.jobs
-- does: dropping a job deletes its history and frames in the same transaction, as before. A job being
-- dropped while an attempt holds its state row waits for that attempt (the state row still cascades).
--
-- begin_atomic reads the claim, the job, the identity, the owner's right to act as the principal and
-- the procedure's privileges in one statement (begin_attempt ran seven, and a call of radix.may_act_as,
-- whose SET clause made it a function call per attempt). The checks and their order are the same: the
-- first that fails raises the same SQLSTATE and message as before.
--
-- end_atomic advances a scheduled tick (no request in flight) with one UPDATE joined to the job, and
-- probes radix.job_requests after it as radix._advance does; a request's tick still goes through
-- radix._advance (stash, backfill ledger).

DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT con.conrelid::regclass AS tab, con.conname
             FROM pg_constraint con
             WHERE con.contype = 'f' AND con.confrelid = 'radix.jobs'::regclass
               AND con.conrelid IN ('radix.radix_system_job_history'::regclass, 'radix.attempt_frames'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', c.tab, c.conname);
    END LOOP;
END $$;

-- What the two ON DELETE CASCADE did: a dropped job's history and frames go with it.
CREATE FUNCTION radix._job_dropped() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM radix.radix_system_job_history h WHERE h.job_id = OLD.job_id;
    DELETE FROM radix.attempt_frames f WHERE f.job_id = OLD.job_id;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION radix._job_dropped() FROM PUBLIC;

CREATE TRIGGER job_dropped AFTER DELETE ON radix.jobs
    FOR EACH ROW EXECUTE FUNCTION radix._job_dropped();

-- -- the attempt MAC ------------------------------------------------------------------------------------

-- One row: 32 bytes from two gen_random_uuid() (pg_strong_random; 244 random bits). Nobody but radix
-- reads it; a new secret (UPDATE as radix) only makes attempts in flight fail their begin and retry.
CREATE TABLE radix.attempt_secret (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret   bytea NOT NULL
);
INSERT INTO radix.attempt_secret (secret)
VALUES (uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));
REVOKE ALL ON radix.attempt_secret FROM PUBLIC;

-- This backend's session key: sha256(secret || pid || backend_start), both fixed-length.
CREATE FUNCTION radix._session_key() RETURNS bytea
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN (SELECT sha256(k.secret || int4send(pg_backend_pid()) || timestamptz_send(a.backend_start))
        FROM radix.attempt_secret k, pg_stat_get_activity(pg_backend_pid()) a);

-- The MAC of `token` for this backend, as the daemon computes it: hex of sha256(session key || token).
CREATE FUNCTION radix._attempt_mac(token uuid) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN encode(sha256(radix._session_key() || uuid_send(token)), 'hex');
REVOKE ALL ON FUNCTION radix._session_key(), radix._attempt_mac(uuid) FROM PUBLIC;

-- The session key of the calling backend (hex), for the daemon to compute MACs for this connection. Any
-- role may ask for its own: it opens nothing without a lease token, which only the scheduler holds.
CREATE FUNCTION radix.attempt_session() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN encode(radix._session_key(), 'hex');

-- As 0003's begin_attempt, keyed by the MAC: the claim, the identity and the privileges, then the frame.
-- The KEY SHARE lock on the state row is held until the attempt's transaction ends (the fence, see 0003).
CREATE FUNCTION radix.begin_atomic(job uuid, mac text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- one read of this backend's status (it copies every backend's entry): the MAC and the frame share it
    started timestamptz := (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a);
    c record;
BEGIN
    -- refused: 0 ok; 1 not logged in as the principal; 2 the owner may no longer act as it (the rule of
    -- radix.may_act_as, inlined); 3 the procedure is gone (or renamed); 4 no privilege to run it
    SELECT s.attempt, s.planned_ns, s.idempotency_key, s.lease_token, j.procedure_signature,
           CASE
               WHEN (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user)
                    IS DISTINCT FROM j.principal_oid THEN 1
               WHEN NOT coalesce((
                   SELECT CASE WHEN a.rolsuper THEN true
                               WHEN t.rolsuper THEN false
                               WHEN j.owner_oid = j.principal_oid THEN true
                               WHEN current_setting('server_version_num')::integer >= 160000
                                   THEN pg_has_role(j.owner_oid, j.principal_oid, 'SET')
                               ELSE pg_has_role(j.owner_oid, j.principal_oid, 'MEMBER') END
                   FROM pg_roles a, pg_roles t WHERE a.oid = j.owner_oid AND t.oid = j.principal_oid), false)
                   THEN 2
               WHEN p.oid IS NULL THEN 3
               WHEN NOT has_database_privilege(j.principal_oid, current_database(), 'CONNECT')
                    OR NOT has_schema_privilege(j.principal_oid, p.pronamespace, 'USAGE')
                    OR NOT has_function_privilege(j.principal_oid, p.oid, 'EXECUTE') THEN 4
               ELSE 0
           END AS refused
    INTO c
    FROM radix.radix_system_job_state s
    JOIN radix.jobs j ON j.job_id = s.job_id
    LEFT JOIN pg_proc p ON p.oid = j.procedure_oid AND p.prokind = 'p'
                       AND p.oid::regprocedure::text = j.procedure_signature
    CROSS JOIN radix.attempt_secret k
    WHERE s.job_id = job AND s.status = 'running'
      -- radix._attempt_mac(s.lease_token), inlined
      AND encode(sha256(sha256(k.secret || int4send(pg_backend_pid()) || timestamptz_send(started))
                        || uuid_send(s.lease_token)), 'hex') = mac
    FOR KEY SHARE OF s;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the claim of this attempt is no longer held' USING ERRCODE = 'RXL01';
    ELSIF c.refused = 1 THEN
        RAISE EXCEPTION 'permission denied: the attempt is not logged in as its principal'
            USING ERRCODE = '42501';
    ELSIF c.refused = 2 THEN
        RAISE EXCEPTION 'permission denied: the job owner may no longer act as its principal'
            USING ERRCODE = '42501';
    ELSIF c.refused = 3 THEN
        RAISE EXCEPTION 'procedure % no longer exists', c.procedure_signature USING ERRCODE = '42883';
    ELSIF c.refused = 4 THEN
        RAISE EXCEPTION 'permission denied for procedure %', c.procedure_signature USING ERRCODE = '42501';
    END IF;
    INSERT INTO radix.attempt_frames AS f
        (pid, backend_start, job_id, attempt, planned_ns, idempotency_key, lease_token)
    VALUES (pg_backend_pid(), started, job, c.attempt, c.planned_ns, c.idempotency_key, c.lease_token)
    ON CONFLICT (pid) DO UPDATE SET backend_start = excluded.backend_start, job_id = excluded.job_id,
        attempt = excluded.attempt, planned_ns = excluded.planned_ns,
        idempotency_key = excluded.idempotency_key, lease_token = excluded.lease_token;
END $$;

-- As 0003's end_attempt (atomic, with 0011's requests), keyed by the MAC: the frame closed and the tick
-- marked succeeded in the attempt's own transaction, fenced by the lease token the frame holds.
CREATE FUNCTION radix.end_atomic(job uuid, mac text, next_planned_ns bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f record;
BEGIN
    -- the frame begin_atomic wrote on this backend holds its backend_start: the MAC without pg_stat
    DELETE FROM radix.attempt_frames d WHERE d.pid = pg_backend_pid() AND d.job_id = job
    RETURNING d.planned_ns, d.attempt, d.lease_token,
              (SELECT encode(sha256(sha256(k.secret || int4send(d.pid) || timestamptz_send(d.backend_start))
                                    || uuid_send(d.lease_token)), 'hex') FROM radix.attempt_secret k) AS mac
    INTO f;
    IF NOT FOUND OR f.mac IS DISTINCT FROM mac THEN
        RAISE EXCEPTION 'the frame of this attempt is gone' USING ERRCODE = 'RXL01';
    END IF;
    -- a scheduled tick: what radix._advance(job, token, next_planned_ns, true, NULL) writes, in one UPDATE
    UPDATE radix.radix_system_job_state s SET
        status = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN 'complete' ELSE 'scheduled' END,
        planned_ns = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN s.planned_ns
                          ELSE next_planned_ns END,
        due_ns = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN NULL ELSE next_planned_ns END,
        attempt = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN s.attempt ELSE 0 END,
        idempotency_key = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN s.idempotency_key END,
        lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, last_error = NULL,
        updated_at = clock_timestamp()
    FROM radix.jobs j
    WHERE s.job_id = job AND s.lease_token = f.lease_token AND s.status = 'running' AND s.request_kind IS NULL
      AND j.job_id = s.job_id;
    IF FOUND THEN
        IF EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = job) THEN
            PERFORM radix._promote_request(job);
        END IF;
    ELSIF NOT radix._advance(job, f.lease_token, next_planned_ns, true, NULL) THEN  -- a request's, or fenced
        RAISE EXCEPTION 'the claim of this attempt is no longer held' USING ERRCODE = 'RXL01';
    END IF;
    UPDATE radix.radix_system_job_history
    SET status = 'succeeded', atomic = true, finished_at = clock_timestamp()
    WHERE job_id = job AND planned_ns = f.planned_ns AND attempt = f.attempt AND status = 'running';
END $$;

GRANT EXECUTE ON FUNCTION radix.attempt_session(), radix.begin_atomic(uuid, text),
    radix.end_atomic(uuid, text, bigint) TO PUBLIC;

-- The token-keyed pair (bound parameters: the non-atomic path) is the MAC-keyed one.
CREATE OR REPLACE FUNCTION radix.begin_attempt(job uuid, token uuid) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM radix.begin_atomic(job, radix._attempt_mac(token));
END $$;

CREATE OR REPLACE FUNCTION radix.end_attempt(job uuid, token uuid, next_planned_ns bigint, atomic boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF atomic THEN
        PERFORM radix.end_atomic(job, radix._attempt_mac(token), next_planned_ns);
        RETURN;
    END IF;
    DELETE FROM radix.attempt_frames WHERE pid = pg_backend_pid() AND job_id = job AND lease_token = token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the frame of this attempt is gone' USING ERRCODE = 'RXL01';
    END IF;
END $$;

-- -- replaced from 0011: the claim ------------------------------------------------------------------------

-- As 0011, serialised by a table lock on radix.claim_serial instead of a row lock on its one row. The row
-- lock wrote the tuple (xmax) and a WAL record at every claim, so a claim that found nothing due still
-- assigned a transaction id and waited for a WAL flush at commit (0.3-0.9 ms, measured with pgbench under
-- load, against 0.05 ms for the table lock). EXCLUSIVE conflicts with itself, so claims still serialise;
-- only radix (the table's owner) may lock it: no other role can hold it.
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
