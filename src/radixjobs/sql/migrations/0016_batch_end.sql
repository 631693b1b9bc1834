-- 0016: a batch of ticks in one statement, its bookkeeping done once for all its ticks (issue #14;
-- engine/batches.py).
--
-- 0015 ran a batch as one statement per tick, each tick's radix.end_tick advancing its state and writing
-- its history row alone. Measured (bench/run.py tickcost --batch 8), end_tick was half of radix's server
-- time per tick, and the same writes made once for the whole batch (one UPDATE, one INSERT) cost less than
-- half as much. So a batch is now one statement, `SELECT … FROM radix.run_ticks(…)`:
--
--   for each tick: the role check and radix.start_tick (begin_tick's lock, checks and frame, its refusals
--   reported instead of raised), then the CALL (its DO block) in an exception block, its own
--   subtransaction: a failure rolls back that tick's CALL alone and is reported in its row;
--   then radix.end_ticks: the last started tick's frame deleted, every state that ran advanced by one
--   UPDATE (each fenced by its token's MAC, as end_tick's), their history rows by one INSERT, the prune and
--   the requests as end_tick's.
--
-- start_tick and end_ticks run in the batch's own transaction, outside the CALLs' subtransactions: a row
-- locked by a subtransaction and then updated by its parent gets a MultiXact to remember the lock (two per
-- tick in the first version of this migration, which ran begin_tick inside each tick's subtransaction).
-- Which ticks ran is known only to run_ticks (PL/pgSQL variables, out of the procedures' reach). end_ticks
-- checks each tick it is given as end_tick did: the state as start_tick found it (its token) and the MAC
-- of this backend's session. When any tick is no longer as it began (ALTER JOB meanwhile), it raises and
-- the whole batch rolls back: each tick then runs alone (engine/batches.py), as after a timeout. So does
-- any error of start_tick but its refusals. One statement means one statement_timeout for the batch: the
-- smallest of its ticks' timeouts, so no tick runs past its own (a tick starts after the statement did);
-- a batch cut short by it runs its ticks alone. run_tick (0015) stays for daemons of the version before.

-- start_tick: begin_tick's lock, checks and frame (0013), the same statements in the same order, with its
-- refusals (RXT01: not this session's tick; 42501, 42883: refused) returned as `error_sqlstate` and
-- `error_message` instead of raised; nothing is written then. Errors other than those still raise.
CREATE FUNCTION radix.start_tick(job uuid, planned_ns bigint, mac text, OUT error_sqlstate text,
                                 OUT error_message text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- key lookups whatever the values: a custom plan per call would re-plan every statement of every tick
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    started timestamptz := (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a);
    c record;
BEGIN
    PERFORM FROM radix.tick_locks t WHERE t.job_id = job FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        error_sqlstate := 'RXT01';
        error_message := 'the tick is not this session''s to run: another session runs it';
        RETURN;
    END IF;
    SELECT s.attempt, j.procedure_signature, x.token,
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
    -- radix._tick_token(job, planned_ns, s.attempt, s.updated_at), inlined
    CROSS JOIN LATERAL (SELECT encode(substring(sha256(k.secret || uuid_send(job) || int8send(start_tick.planned_ns)
                                                       || int4send(s.attempt) || timestamptz_send(s.updated_at))
                                                FROM 1 FOR 16), 'hex')::uuid AS token) x
    WHERE s.job_id = job AND s.status IN ('scheduled', 'retry_wait') AND s.request_kind IS NULL
      AND NOT s.via_lease AND s.due_ns <= radix.to_ns(clock_timestamp())
      AND encode(sha256(sha256(k.secret || int4send(pg_backend_pid()) || timestamptz_send(started))
                        || uuid_send(x.token)), 'hex') = mac
    -- as begin_atomic: radix.claim_due (FOR UPDATE ... SKIP LOCKED) passes the row by while the tick runs,
    -- and ALTER JOB (a plain UPDATE) does not wait for it
    FOR KEY SHARE OF s;
    IF NOT FOUND THEN
        error_sqlstate := 'RXT01';
        error_message := 'the tick is not this session''s to run: it ran, or changed since it was found';
    ELSIF c.refused = 1 THEN
        error_sqlstate := '42501';
        error_message := 'permission denied: the attempt is not logged in as its principal';
    ELSIF c.refused = 2 THEN
        error_sqlstate := '42501';
        error_message := 'permission denied: the job owner may no longer act as its principal';
    ELSIF c.refused = 3 THEN
        error_sqlstate := '42883';
        error_message := format('procedure %s no longer exists', c.procedure_signature);
    ELSIF c.refused = 4 THEN
        error_sqlstate := '42501';
        error_message := format('permission denied for procedure %s', c.procedure_signature);
    END IF;
    IF error_sqlstate IS NOT NULL THEN
        RETURN;
    END IF;
    INSERT INTO radix.attempt_frames AS f
        (pid, backend_start, job_id, attempt, planned_ns, idempotency_key, lease_token)
    VALUES (pg_backend_pid(), started, job, c.attempt + 1, start_tick.planned_ns,
            job::text || '/' || start_tick.planned_ns::text, c.token)
    ON CONFLICT (pid) DO UPDATE SET backend_start = excluded.backend_start, job_id = excluded.job_id,
        attempt = excluded.attempt, planned_ns = excluded.planned_ns,
        idempotency_key = excluded.idempotency_key, lease_token = excluded.lease_token;
END $$;

GRANT EXECUTE ON FUNCTION radix.start_tick(uuid, bigint, text) TO PUBLIC;

-- begin_tick (the lone tick's): start_tick, its refusal raised with its SQLSTATE (the daemon reads RXT01
-- from begin_tick as before: engine/attempt.py, begin_tick_refused).
CREATE OR REPLACE FUNCTION radix.begin_tick(job uuid, planned_ns bigint, mac text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM radix.start_tick(job, planned_ns, mac);
    IF r.error_sqlstate IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_sqlstate, MESSAGE = r.error_message;
    END IF;
END $$;

-- end_ticks: the end of a batch's ticks: `jobs`, with their ticks (`planned`), attempts (`attempts`: the
-- state's attempt + 1, as radix.find_ticks gave them), MACs (as start_tick took them), following ticks
-- (`nexts`, NULL: none) and whether each ran (`ran`: its CALL done in this transaction); `node` hex-encoded.
-- Markers are written for the ticks that ran; RXL01 when one of them is no longer as begun (nothing is
-- written then). The frame the last started tick left (start_tick writes it in the batch's transaction,
-- so a tick whose CALL failed leaves it too) is deleted when its MAC is one of the batch's, as end_tick
-- checks a frame's.
CREATE FUNCTION radix.end_ticks(jobs uuid[], planned bigint[], attempts integer[], macs text[], nexts bigint[],
                                ran boolean[], node text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- key lookups whatever the values, as begin_tick and end_tick
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    ran_jobs uuid[] := ARRAY(SELECT u.job FROM unnest(jobs, ran) AS u(job, did) WHERE u.did);
    written integer;
BEGIN
    DELETE FROM radix.attempt_frames f
    USING unnest(jobs, macs) AS u(job, mac), radix.attempt_secret k
    WHERE f.pid = pg_backend_pid() AND f.job_id = u.job
      AND encode(sha256(sha256(k.secret || int4send(f.pid) || timestamptz_send(f.backend_start))
                        || uuid_send(f.lease_token)), 'hex') = u.mac;
    IF cardinality(ran_jobs) = 0 THEN
        RETURN;
    END IF;
    -- a history row left 'running' by a lease fenced before (ALTER JOB) belongs to no attempt now (as
    -- end_tick closes it; rolled back with the rest if a tick is no longer as begun)
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
        error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                                   'category', 'connection',
                                   'detail', jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = ANY (ran_jobs) AND h.status = 'running';
    WITH t AS (
        SELECT * FROM unnest(jobs, planned, attempts, macs, nexts, ran)
                      AS t(job, planned_ns, attempt, mac, next_ns, did)
        WHERE t.did
    ), session AS MATERIALIZED (  -- once, not once per state row
        SELECT k.secret, sha256(k.secret || int4send(pg_backend_pid()) || timestamptz_send(a.backend_start)) AS key
        FROM radix.attempt_secret k, pg_stat_get_activity(pg_backend_pid()) a
    ), advanced AS (
        -- as end_tick's UPDATE, for every tick at once; the MAC is checked against the state itself
        UPDATE radix.radix_system_job_state s SET
            status = CASE WHEN j.schedule_kind = 'at' OR t.next_ns IS NULL THEN 'complete' ELSE 'scheduled' END,
            planned_ns = CASE WHEN j.schedule_kind = 'at' OR t.next_ns IS NULL THEN t.planned_ns ELSE t.next_ns END,
            due_ns = CASE WHEN j.schedule_kind = 'at' OR t.next_ns IS NULL THEN NULL ELSE t.next_ns END,
            attempt = CASE WHEN j.schedule_kind = 'at' OR t.next_ns IS NULL THEN t.attempt ELSE 0 END,
            idempotency_key = CASE WHEN j.schedule_kind = 'at' OR t.next_ns IS NULL
                                   THEN t.job::text || '/' || t.planned_ns::text END,
            coalesced_ticks = s.coalesced_ticks + CASE WHEN j.schedule_kind = 'every'
                                                       THEN (t.planned_ns - s.planned_ns) / j.interval_ns ELSE 0 END,
            last_error = NULL, updated_at = clock_timestamp()
        FROM t, radix.jobs j, session x
        -- `= ANY (ran_jobs)`: key probes whatever the plan (a generic plan does not know the batch is small)
        WHERE s.job_id = ANY (ran_jobs) AND j.job_id = ANY (ran_jobs) AND s.job_id = t.job AND j.job_id = t.job
          AND s.status IN ('scheduled', 'retry_wait')
          AND s.request_kind IS NULL AND NOT s.via_lease AND s.attempt = t.attempt - 1
          -- the MAC of radix._tick_token(job, planned, s.attempt, s.updated_at), inlined
          AND encode(sha256(x.key || uuid_send(encode(substring(sha256(x.secret || uuid_send(t.job)
                                                                       || int8send(t.planned_ns)
                                                                       || int4send(s.attempt)
                                                                       || timestamptz_send(s.updated_at))
                                                                FROM 1 FOR 16), 'hex')::uuid)), 'hex') = t.mac
        RETURNING s.job_id, s.definition_version, t.planned_ns, t.attempt
    )
    INSERT INTO radix.radix_system_job_history
        (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind, atomic,
         started_at, finished_at)
    SELECT a.job_id, a.definition_version, a.planned_ns, a.attempt, a.job_id::text || '/' || a.planned_ns::text,
           'succeeded', convert_from(decode(end_ticks.node, 'hex'), 'UTF8'), 'schedule', true, now(), clock_timestamp()
    FROM advanced a;
    GET DIAGNOSTICS written = ROW_COUNT;
    IF written <> cardinality(ran_jobs) THEN
        RAISE EXCEPTION 'a tick of the batch is no longer as it began' USING ERRCODE = 'RXL01';
    END IF;
    -- each job's rows past its limit, by radix._prune_history (its plan walks the job's index backward and
    -- stops at the limit; one set-based DELETE for the batch was planned as a bitmap scan and a sort of
    -- every row of the batch's jobs, which grew with their history)
    PERFORM radix._prune_history(u.job) FROM unnest(ran_jobs) AS u(job);
    IF EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = ANY (ran_jobs)) THEN
        PERFORM radix._promote_request(q.job_id)
        FROM (SELECT DISTINCT r.job_id FROM radix.job_requests r WHERE r.job_id = ANY (ran_jobs)) q;
    END IF;
END $$;

GRANT EXECUTE ON FUNCTION radix.end_ticks(uuid[], bigint[], integer[], text[], bigint[], boolean[], text)
    TO PUBLIC;

-- run_ticks: a batch, one row per tick in order: `failed_at` NULL when the tick ran (its marker written by
-- end_ticks at the end of this statement), else the step that failed ('begin': nothing ran, e.g. RXT01 or
-- RXT02; 'call': the procedure failed, and its subtransaction rolled back) with the error's SQLSTATE and
-- message. query_canceled (the statement timeout, a cancel) is not caught: it aborts the whole batch, and
-- so does a failure of end_ticks. SECURITY INVOKER and without SET clauses, as run_tick: the CALLs run as
-- the principal with its own settings, so every name and operator below is qualified. A role switched by
-- an earlier tick (SET LOCAL ROLE) is not run: RXT02, and the daemon runs that tick alone afterwards.
CREATE FUNCTION radix.run_ticks(jobs uuid[], planned bigint[], attempts integer[], macs text[], calls text[],
                                nexts bigint[], node text)
RETURNS TABLE (failed_at text, error_sqlstate text, error_message text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    ran boolean[] := '{}';
BEGIN
    FOR i IN 1 .. pg_catalog.cardinality(jobs) LOOP
        failed_at := NULL;
        error_sqlstate := NULL;
        error_message := NULL;
        IF CURRENT_USER OPERATOR(pg_catalog.<>) SESSION_USER THEN
            error_sqlstate := 'RXT02';
            error_message := 'the tick is not run here: the session''s role changed';
        ELSE
            SELECT r.error_sqlstate, r.error_message INTO error_sqlstate, error_message
            FROM radix.start_tick(jobs[i], planned[i], macs[i]) r;
        END IF;
        IF error_sqlstate IS NOT NULL THEN
            failed_at := 'begin';
        ELSE
            BEGIN
                EXECUTE calls[i];
            EXCEPTION WHEN OTHERS THEN
                failed_at := 'call';
                GET STACKED DIAGNOSTICS error_sqlstate = RETURNED_SQLSTATE, error_message = MESSAGE_TEXT;
            END;
        END IF;
        ran := pg_catalog.array_append(ran, failed_at IS NULL);
        RETURN NEXT;
    END LOOP;
    PERFORM radix.end_ticks(jobs, planned, attempts, macs, nexts, ran, node);
END $$;

GRANT EXECUTE ON FUNCTION radix.run_ticks(uuid[], bigint[], integer[], text[], text[], bigint[], text) TO PUBLIC;
