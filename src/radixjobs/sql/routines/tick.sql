-- A lone tick: claimed, begun and ended in the principal's own transaction.

-- End the tick begun on this backend: the frame closed (its MAC checked), the state advanced and one
-- history row written, in the tick's own transaction. A tick published as a lease meanwhile
-- (radix.claim_tick) ends as end_atomic ends an attempt: radix._advance, fenced by its token.
-- `node` is the daemon's node id, hex-encoded (the query text carries no quotes but its own).
CREATE OR REPLACE FUNCTION radix.end_tick(job uuid, mac text, next_planned_ns bigint, node text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- key lookups whatever the values: a custom plan per call would re-plan every statement of every tick
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    f record;
BEGIN
    DELETE FROM radix.attempt_frames d WHERE d.pid = pg_backend_pid() AND d.job_id = job
    RETURNING d.planned_ns, d.attempt, d.lease_token, d.idempotency_key,
              (SELECT radix._mac_of(radix._session_key_of(k.secret, d.pid, d.backend_start), d.lease_token)
               FROM radix.attempt_secret k) AS mac
    INTO f;
    IF NOT FOUND OR f.mac IS DISTINCT FROM mac THEN
        RAISE EXCEPTION 'the frame of this attempt is gone' USING ERRCODE = 'RXL01';
    END IF;
    -- not published: the state is as begin_tick found it (its token still derives from it)
    UPDATE radix.radix_system_job_state s SET
        (status, planned_ns, due_ns, attempt, idempotency_key) =
            (SELECT * FROM radix._advanced(j.schedule_kind, next_planned_ns, true, f.planned_ns, f.attempt,
                                           f.idempotency_key, job, j.jitter_ns)),
        coalesced_ticks = s.coalesced_ticks
                          + radix._ticks_coalesced(j.schedule_kind, s.planned_ns, f.planned_ns, j.interval_ns),
        last_error = NULL, updated_at = clock_timestamp()
    FROM radix.jobs j, radix.attempt_secret k
    WHERE s.job_id = job AND j.job_id = job AND s.status IN ('scheduled', 'retry_wait')
      AND s.request_kind IS NULL AND s.attempt = f.attempt - 1
      AND radix._token_of(k.secret, job, f.planned_ns, s.attempt, s.updated_at) = f.lease_token;
    IF FOUND THEN
        -- a history row left 'running' by a lease fenced before (ALTER JOB) belongs to no attempt now (the
        -- same close as claim_due's and claim_tick's, inline: this is the hot path)
        UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
            error = radix._lease_lost(jsonb_build_object('reason', 'job redefined'))
        WHERE h.job_id = job AND h.status = 'running';
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
        PERFORM radix._prune_history(job);
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

-- claim_tick: make the tick the finder handed out (its token `token`) a lease of `node`, as radix.claim_due
-- claims a row, with `token` as the lease token: for a tick that failed (its transaction rolled back), one
-- whose procedure commits inside (2D000), or one running for long (published: the state shows it running,
-- and its lease is renewed and fenced as any other). Returns claim_due's columns, or no row when the tick
-- is no longer as found (it ran, was re-armed, or another node took it). A tick another transaction holds
-- is claimed only when `publish` (this node's own tick holds it); otherwise it is left alone. `started_at`:
-- when the tick's attempt began, as the daemon saw it (its history row's start; end_tick corrects it).
CREATE OR REPLACE FUNCTION radix.claim_tick(node text, job uuid, tick_ns bigint, token uuid, lease_seconds integer,
                                 publish boolean, started_at timestamptz)
RETURNS TABLE (job_id uuid, definition_version bigint, lease_token uuid, planned_ns bigint,
               attempt integer, idempotency_key text, resumed boolean, coalesced bigint, anchor_ns bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    now_ts timestamptz := clock_timestamp();
    lease interval := make_interval(secs => greatest(coalesce(lease_seconds, 300), 1));
BEGIN
    IF NOT publish THEN
        PERFORM FROM radix.tick_locks t WHERE t.job_id = job FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- a history row still 'running' for the job belongs to no attempt (its state is not running)
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = now_ts,
        error = radix._lease_lost(jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = job AND h.status = 'running'
      AND NOT EXISTS (SELECT 1 FROM radix.radix_system_job_state s
                      WHERE s.job_id = job AND s.status = 'running');
    RETURN QUERY
    WITH claimed AS (
        UPDATE radix.radix_system_job_state s SET
            status = 'running',
            planned_ns = tick_ns,
            attempt = s.attempt + 1,
            idempotency_key = s.job_id::text || '/' || tick_ns::text,
            lease_node = node,
            lease_token = token,
            lease_expires_at = now_ts + lease,
            due_ns = radix.to_ns(now_ts + lease),
            coalesced_ticks = s.coalesced_ticks
                              + radix._ticks_coalesced(j.schedule_kind, s.planned_ns, tick_ns, j.interval_ns),
            updated_at = now_ts
        FROM radix.jobs j
        WHERE s.job_id = job AND j.job_id = job AND s.status IN ('scheduled', 'retry_wait')
          AND s.request_kind IS NULL
          AND radix._tick_token(job, tick_ns, s.attempt, s.updated_at) = token
        RETURNING s.job_id, s.definition_version, s.lease_token, s.planned_ns, s.attempt, s.idempotency_key,
                  radix._ticks_coalesced(j.schedule_kind, s.planned_ns, tick_ns, j.interval_ns) AS coalesced,
                  s.anchor_ns
    ), started AS (
        INSERT INTO radix.radix_system_job_history
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind, started_at)
        SELECT c.job_id, c.definition_version, c.planned_ns, c.attempt, c.idempotency_key, 'running', node,
               'schedule', least(coalesce(claim_tick.started_at, now_ts), now_ts)
        FROM claimed c
        RETURNING 1
    )
    SELECT c.job_id, c.definition_version, c.lease_token, c.planned_ns, c.attempt, c.idempotency_key, false,
           0::bigint, c.anchor_ns
    FROM claimed c;
    PERFORM radix._prune_history(job);
END $$;

-- begin_tick: the lone tick's start, in the principal's own transaction: the tick lock (FOR UPDATE SKIP
-- LOCKED), the token's MAC, the identity and privileges, the frame, and the tick's stored arguments in the
-- setting `radix.arguments` for its DO block (until the transaction ends): radix.start_tick, its refusal
-- raised. (An assignment, not SELECT … FROM: no function scan and tuplestore for its one row.)
CREATE OR REPLACE FUNCTION radix.begin_tick(job uuid, planned_ns bigint, mac text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    r record;
BEGIN
    r := radix.start_tick(job, planned_ns, mac);
    IF r.error_sqlstate IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_sqlstate, MESSAGE = r.error_message;
    END IF;
END $$;
