-- A lease attempt: begun and ended on the principal's session, renewed by the node.

-- Extend the leases `node` holds for the attempts it is running (their tokens) to `lease_seconds` from
-- now; returns the tokens still held. A token missing from the result is a lost lease (ALTER JOB, DROP
-- JOB CASCADE, or another node took the claim): the engine cancels that attempt. Nothing is renewed
-- while the node is not alive (its control session gone): other nodes may then take its claims.
-- A row locked by a writer (an attempt finalising, a claimer) is skipped, never waited for: it counts as
-- held (as this statement's snapshot sees it) and is renewed next time if it still is. FOR NO KEY UPDATE
-- does not conflict with the KEY SHARE lock a running atomic attempt holds.
CREATE OR REPLACE FUNCTION radix.renew_leases(node text, tokens uuid[], lease_seconds integer)
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    until timestamptz := clock_timestamp() + make_interval(secs => greatest(coalesce(lease_seconds, 300), 1));
BEGIN
    IF NOT radix.node_alive(node) THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH free AS (
        SELECT s.job_id FROM radix.radix_system_job_state s
        WHERE s.lease_token = ANY (tokens) AND s.lease_node = node AND s.status = 'running'
        FOR NO KEY UPDATE SKIP LOCKED
    ), renewed AS (
        UPDATE radix.radix_system_job_state s SET lease_expires_at = until, due_ns = radix.to_ns(until)
        FROM free f WHERE s.job_id = f.job_id
        RETURNING 1
    )
    SELECT s.lease_token FROM radix.radix_system_job_state s
    WHERE s.lease_token = ANY (tokens) AND s.lease_node = node AND s.status = 'running';
END $$;

-- An atomic lease attempt's begin, keyed by the MAC: the claim, the identity and the privileges, then the
-- frame. The KEY SHARE lock on the state row is held until the attempt's transaction ends (the fence).
CREATE OR REPLACE FUNCTION radix.begin_atomic(job uuid, mac text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    -- one read of this backend's status (it copies every backend's entry): the MAC and the frame share it
    started timestamptz := (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a);
    c record;
BEGIN
    SELECT s.attempt, s.planned_ns, s.idempotency_key, s.lease_token, e.code, e.message
    INTO c
    FROM radix.radix_system_job_state s
    JOIN radix.jobs j ON j.job_id = s.job_id
    -- the procedure this attempt CALLs: the job's, or its on_failure hook's (hooks.sql)
    CROSS JOIN LATERAL (SELECT CASE WHEN s.request_kind = 'on_failure' THEN j.on_failure_oid ELSE j.procedure_oid END,
                               CASE WHEN s.request_kind = 'on_failure' THEN j.on_failure_signature
                                    ELSE j.procedure_signature END) AS h(oid, signature)
    LEFT JOIN pg_proc p ON p.oid = h.oid AND p.prokind = 'p' AND p.oid::regprocedure::text = h.signature
    CROSS JOIN LATERAL radix._refusal(j.principal_oid, j.owner_oid, p.oid, p.pronamespace) r
    LEFT JOIN LATERAL radix._refusal_error(r.refused, h.signature) e ON true
    CROSS JOIN radix.attempt_secret k
    WHERE s.job_id = job AND s.status = 'running'
      AND radix._mac_of(radix._session_key_of(k.secret, pg_backend_pid(), started), s.lease_token) = mac
    FOR KEY SHARE OF s;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the claim of this attempt is no longer held' USING ERRCODE = 'RXL01';
    ELSIF c.code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = c.code, MESSAGE = c.message;
    END IF;
    INSERT INTO radix.attempt_frames AS f
        (pid, backend_start, job_id, attempt, planned_ns, idempotency_key, lease_token)
    VALUES (pg_backend_pid(), started, job, c.attempt, c.planned_ns, c.idempotency_key, c.lease_token)
    ON CONFLICT (pid) DO UPDATE SET backend_start = excluded.backend_start, job_id = excluded.job_id,
        attempt = excluded.attempt, planned_ns = excluded.planned_ns,
        idempotency_key = excluded.idempotency_key, lease_token = excluded.lease_token;
END $$;

-- An atomic lease attempt's end, keyed by the MAC: the frame closed and the tick marked succeeded (the
-- ticks of the jobs that run after it queued) in the attempt's own transaction, fenced by the lease token
-- the frame holds.
CREATE OR REPLACE FUNCTION radix.end_atomic(job uuid, mac text, next_planned_ns bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    f record;
BEGIN
    -- the frame begin_atomic wrote on this backend holds its backend_start: the MAC without pg_stat
    DELETE FROM radix.attempt_frames d WHERE d.pid = pg_backend_pid() AND d.job_id = job
    RETURNING d.planned_ns, d.attempt, d.lease_token,
              (SELECT radix._mac_of(radix._session_key_of(k.secret, d.pid, d.backend_start), d.lease_token)
               FROM radix.attempt_secret k) AS mac
    INTO f;
    IF NOT FOUND OR f.mac IS DISTINCT FROM mac THEN
        RAISE EXCEPTION 'the frame of this attempt is gone' USING ERRCODE = 'RXL01';
    END IF;
    -- a scheduled tick: what radix._advance(job, token, next_planned_ns, true, NULL) writes, in one UPDATE
    UPDATE radix.radix_system_job_state s SET
        (status, planned_ns, due_ns, attempt, idempotency_key) =
            (SELECT * FROM radix._advanced(j.schedule_kind, next_planned_ns, true, s.planned_ns, s.attempt,
                                           s.idempotency_key, s.job_id, j.jitter_ns)),
        lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, last_error = NULL,
        updated_at = clock_timestamp()
    FROM radix.jobs j
    WHERE s.job_id = job AND s.lease_token = f.lease_token AND s.status = 'running' AND s.request_kind IS NULL
      AND j.job_id = s.job_id;
    IF FOUND THEN
        IF EXISTS (SELECT 1 FROM radix.job_edges e WHERE e.upstream_id = job) THEN
            PERFORM radix._fire_dependents(job, f.planned_ns, 'schedule', true);
        END IF;
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

-- The token-keyed pair (bound parameters: the non-atomic path) is the MAC-keyed one.
CREATE OR REPLACE FUNCTION radix.begin_attempt(job uuid, token uuid) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    PERFORM radix.begin_atomic(job, radix._attempt_mac(token));
END $$;

CREATE OR REPLACE FUNCTION radix.end_attempt(job uuid, token uuid, next_planned_ns bigint, atomic boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
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
