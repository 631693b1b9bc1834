-- A lone tick: started, run and ended in one statement of the principal's own transaction.

-- run_tick: the lone tick. `call` is its CALL (engine/definitions.py, build_tick_call), run by EXECUTE … USING
-- the tick's stored arguments, never in the query text; `attempt` is the state's attempt + 1 and `mac` the
-- MAC of the tick's token, as radix.find_ticks gave them; `node` hex-encoded. The tick is started by
-- radix.start_tick (its refusal returned as the row, nothing written and nothing run), its procedure run with
-- its frame in the setting `radix.tick` (radix._frame), and ended by radix.end_tick. An error of the procedure
-- or of the end aborts the transaction, the tick's and its marker's together. Invoker's rights and no SET
-- clause, as radix.run_ticks: the procedure runs as the principal, in the principal's settings; every name and
-- operator here is qualified.
CREATE OR REPLACE FUNCTION radix.run_tick(job uuid, planned bigint, attempt integer, mac text, call text,
                                          next_ns bigint, node text)
RETURNS TABLE (failed_at text, error_sqlstate text, error_message text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    started record;
BEGIN
    started := radix.start_tick(job, planned, mac);
    IF started.error_sqlstate IS NOT NULL THEN
        failed_at := 'begin';
        error_sqlstate := started.error_sqlstate;
        error_message := started.error_message;
    ELSIF CURRENT_USER OPERATOR(pg_catalog.<>) SESSION_USER THEN
        failed_at := 'begin';
        error_sqlstate := 'RXT02';
        error_message := 'the tick is not run here: the session''s role changed';
    ELSE
        PERFORM pg_catalog.set_config('radix.tick', started.frame, true);
        EXECUTE call USING started.arguments;
        PERFORM pg_catalog.set_config('radix.tick', '', true);
        PERFORM radix.end_tick(job, planned, attempt, mac, next_ns, node);
    END IF;
    RETURN NEXT;
END $$;

-- start_tick: the lone tick's start: the tick lock (FOR UPDATE SKIP LOCKED), the state as found (its token's
-- MAC), the start deadline, the identity and privileges; returns the tick's frame (the value of `radix.tick`
-- for this transaction: job/attempt/tick and its MAC, as radix.start_ticks makes a batched tick's) and its
-- stored arguments, or its refusal (RXT01: not this session's tick; 42501, 42883: refused) as
-- `error_sqlstate` and `error_message`; nothing is written then. Errors other than those raise.
CREATE OR REPLACE FUNCTION radix.start_tick(job uuid, planned_ns bigint, mac text, OUT error_sqlstate text,
                                            OUT error_message text, OUT frame text, OUT arguments jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- key lookups whatever the values: a custom plan per call would re-plan every statement of every tick
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    c record;
BEGIN
    PERFORM FROM radix.tick_locks t WHERE t.job_id = job FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        error_sqlstate := 'RXT01';
        error_message := 'the tick is not this session''s to run: another session runs it';
        RETURN;
    END IF;
    -- in a later statement than the lock, so that its snapshot is newer
    SELECT s.attempt, j.arguments, e.code, e.message,
           f.text || '/' || radix._tick_frame_mac_of(k.secret, pg_current_xact_id()::text || '/' || f.text) AS frame
    INTO c
    FROM radix.radix_system_job_state s
    JOIN radix.jobs j ON j.job_id = s.job_id
    LEFT JOIN pg_proc p ON p.oid = j.procedure_oid AND p.prokind = 'p'
                       AND p.oid::regprocedure::text = j.procedure_signature
    CROSS JOIN LATERAL radix._refusal(j.principal_oid, j.owner_oid, p.oid, p.pronamespace) r
    LEFT JOIN LATERAL radix._refusal_error(r.refused, j.procedure_signature) e ON true
    CROSS JOIN radix.attempt_secret k
    CROSS JOIN LATERAL (SELECT job::text || '/' || (s.attempt + 1)::text || '/' || start_tick.planned_ns::text AS text) f
    WHERE s.job_id = job AND s.status IN ('scheduled', 'retry_wait') AND s.request_kind IS NULL
      AND NOT s.via_lease AND s.due_ns <= radix.to_ns(clock_timestamp())
      AND NOT (s.status = 'scheduled' AND radix._tick_missed(job, start_tick.planned_ns, j.jitter_ns,
                                                              j.start_deadline_ns, radix.to_ns(clock_timestamp())))
      AND radix._mac_of(radix._session_key_of(k.secret, pg_backend_pid(),
                                              (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a)),
                        radix._token_of(k.secret, job, start_tick.planned_ns, s.attempt, s.updated_at)) = mac
    -- as start_ticks: radix.claim_due (FOR UPDATE ... SKIP LOCKED) passes the row by while the tick runs,
    -- and ALTER JOB (a plain UPDATE) does not wait for it
    FOR KEY SHARE OF s;
    IF NOT FOUND THEN
        error_sqlstate := 'RXT01';
        error_message := 'the tick is not this session''s to run: it ran, changed since it was found, or missed '
                         'its start deadline';
    ELSIF c.code IS NOT NULL THEN
        error_sqlstate := c.code;
        error_message := c.message;
    ELSE
        frame := c.frame;
        arguments := c.arguments;
    END IF;
END $$;

-- end_tick: the lone tick's end, in its own transaction: the state advanced and one history row written,
-- fenced by the MAC of the tick's token checked against the state itself (as radix.end_ticks checks a
-- batch's). A tick published as a lease meanwhile (radix.claim_tick) ends as end_atomic ends an attempt:
-- radix._advance, fenced by its token. RXL01 when the tick is neither (nothing is written).
CREATE OR REPLACE FUNCTION radix.end_tick(job uuid, planned bigint, attempt integer, mac text, next_ns bigint,
                                          node text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    key bytea := (SELECT radix._session_key_of(k.secret, pg_backend_pid(), a.backend_start)
                  FROM radix.attempt_secret k, pg_stat_get_activity(pg_backend_pid()) a);
    token uuid;
BEGIN
    UPDATE radix.radix_system_job_state s SET
        (status, planned_ns, due_ns, attempt, idempotency_key) =
            (SELECT * FROM radix._advanced(j.schedule_kind, next_ns, true, end_tick.planned, end_tick.attempt,
                                           job::text || '/' || end_tick.planned::text, job, j.jitter_ns)),
        coalesced_ticks = s.coalesced_ticks
                          + radix._ticks_coalesced(j.schedule_kind, s.planned_ns, end_tick.planned, j.interval_ns),
        last_error = NULL, updated_at = clock_timestamp()
    FROM radix.jobs j, radix.attempt_secret k
    WHERE s.job_id = job AND j.job_id = job AND s.status IN ('scheduled', 'retry_wait')
      AND s.request_kind IS NULL AND NOT s.via_lease AND s.attempt = end_tick.attempt - 1
      AND radix._mac_of(key, radix._token_of(k.secret, job, end_tick.planned, s.attempt, s.updated_at)) = mac;
    IF FOUND THEN
        -- a history row left 'running' by a lease fenced before (ALTER JOB) belongs to no attempt now (the
        -- same close as claim_due's and claim_tick's, inline: this is the hot path)
        UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
            error = radix._lease_lost(jsonb_build_object('reason', 'job redefined'))
        WHERE h.job_id = job AND h.status = 'running';
        INSERT INTO radix.radix_system_job_history AS h
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind, atomic,
             started_at, finished_at)
        SELECT job, s.definition_version, end_tick.planned, end_tick.attempt,
               job::text || '/' || end_tick.planned::text, 'succeeded', convert_from(decode(node, 'hex'), 'UTF8'),
               'schedule', true, now(), clock_timestamp()
        FROM radix.radix_system_job_state s WHERE s.job_id = job;
        IF EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = job) THEN
            PERFORM radix._promote_request(job);
        END IF;
        PERFORM radix._prune_history(job);
        RETURN;
    END IF;
    -- published (radix.claim_tick): a lease with the tick's token
    SELECT s.lease_token INTO token FROM radix.radix_system_job_state s
    WHERE s.job_id = job AND s.status = 'running' AND s.planned_ns = end_tick.planned
      AND s.attempt = end_tick.attempt AND radix._mac_of(key, s.lease_token) = mac;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the tick is no longer as it began' USING ERRCODE = 'RXL01';
    END IF;
    IF NOT radix._advance(job, token, next_ns, true, NULL) THEN
        RAISE EXCEPTION 'the claim of this attempt is no longer held' USING ERRCODE = 'RXL01';
    END IF;
    UPDATE radix.radix_system_job_history h
    SET status = 'succeeded', atomic = true, started_at = now(), finished_at = clock_timestamp()
    WHERE h.job_id = job AND h.planned_ns = end_tick.planned AND h.attempt = end_tick.attempt
      AND h.status = 'running';
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
