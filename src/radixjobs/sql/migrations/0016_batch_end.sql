-- 0016: a batch of ticks in one statement, its bookkeeping done once for all its ticks (issue #14;
-- engine/batches.py).
--
-- 0015 ran a batch as one statement per tick, each tick's radix.end_tick advancing its state and writing
-- its history row alone. Measured (bench/run.py tickcost --batch 8), end_tick was half of radix's server
-- time per tick, and the same writes made once for the whole batch (one UPDATE, one INSERT) cost less than
-- half as much. So a batch is now one statement, `SELECT … FROM radix.run_ticks(…)`:
--
--   for each tick, in an exception block (its own subtransaction): the role check, radix.begin_tick, the
--   CALL (its DO block); a failure rolls back that tick alone and is reported in its row;
--   then radix.end_ticks for the ticks that ran: the last frame deleted, every state advanced by one
--   UPDATE (each fenced by its token's MAC, as end_tick's), their history rows by one INSERT, the prune and
--   the requests as end_tick's.
--
-- Which ticks ran is known only to run_ticks (PL/pgSQL variables, out of the procedures' reach). end_ticks
-- checks each tick it is given as end_tick did: the state as begin_tick found it (its token) and the MAC
-- of this backend's session. When any tick is no longer as it began (ALTER JOB meanwhile), it raises and
-- the whole batch rolls back: each tick then runs alone (engine/batches.py), as after a timeout. One
-- statement means one statement_timeout for the batch: the smallest of its ticks' timeouts, so no tick
-- runs past its own (a tick starts after the statement did); a batch cut short by it runs its ticks alone.
-- run_tick (0015) stays for daemons of the version before.

-- end_ticks: the end of the ticks of a batch that ran (their CALLs done in this transaction): `jobs`,
-- with their ticks (`planned`), attempts (`attempts`: the state's attempt + 1, as radix.find_ticks gave
-- them), MACs (as begin_tick took them) and following ticks (`nexts`, NULL: none); `node` hex-encoded.
-- RXL01 when a tick's state is no longer as begun; nothing is written then.
CREATE FUNCTION radix.end_ticks(jobs uuid[], planned bigint[], attempts integer[], macs text[], nexts bigint[],
                                node text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- key lookups whatever the values, as begin_tick and end_tick
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    expected integer := coalesce(cardinality(jobs), 0);
    written integer;
BEGIN
    IF expected = 0 THEN
        RETURN;
    END IF;
    -- the frame of the last tick that ran (each tick's begin_tick replaced the one before it)
    DELETE FROM radix.attempt_frames f WHERE f.pid = pg_backend_pid() AND f.job_id = ANY (jobs);
    -- a history row left 'running' by a lease fenced before (ALTER JOB) belongs to no attempt now (as
    -- end_tick closes it; rolled back with the rest if a tick is no longer as begun)
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
        error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                                   'category', 'connection',
                                   'detail', jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = ANY (jobs) AND h.status = 'running';
    WITH t AS (
        SELECT * FROM unnest(jobs, planned, attempts, macs, nexts) AS t(job, planned_ns, attempt, mac, next_ns)
    ), session AS (
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
        -- `= ANY (jobs)`: key probes whatever the plan (a generic plan does not know the batch is small)
        WHERE s.job_id = ANY (jobs) AND j.job_id = ANY (jobs) AND s.job_id = t.job AND j.job_id = t.job
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
    IF written <> expected THEN
        RAISE EXCEPTION 'a tick of the batch is no longer as it began' USING ERRCODE = 'RXL01';
    END IF;
    -- radix._prune_history for each job: its rows past its limit, newest first
    DELETE FROM radix.radix_system_job_history h
    USING (SELECT u.job, (SELECT o.history_id FROM radix.radix_system_job_history o WHERE o.job_id = u.job
                          ORDER BY o.history_id DESC OFFSET j.history_limit LIMIT 1) AS cut
           FROM unnest(jobs) AS u(job) JOIN radix.jobs j ON j.job_id = u.job WHERE j.job_id = ANY (jobs)) c
    WHERE h.job_id = ANY (jobs) AND h.job_id = c.job AND h.history_id <= c.cut;
    IF EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = ANY (jobs)) THEN
        PERFORM radix._promote_request(q.job_id)
        FROM (SELECT DISTINCT r.job_id FROM radix.job_requests r WHERE r.job_id = ANY (jobs)) q;
    END IF;
END $$;

GRANT EXECUTE ON FUNCTION radix.end_ticks(uuid[], bigint[], integer[], text[], bigint[], text) TO PUBLIC;

-- run_ticks: a batch, one row per tick in order: `failed_at` NULL when the tick ran (its marker written by
-- end_ticks at the end of this statement), else the step that failed ('begin': nothing ran, e.g. RXT01 or
-- RXT02; 'call': the procedure failed) with the error's SQLSTATE and message; that tick is rolled back
-- alone. query_canceled (the statement timeout, a cancel) is not caught: it aborts the whole batch, and
-- so does a failure of end_ticks. SECURITY INVOKER and without SET clauses, as run_tick: the CALLs run as
-- the principal with its own settings, so every name and operator below is qualified. A role switched by
-- an earlier tick (SET LOCAL ROLE) is not run: RXT02, and the daemon runs that tick alone afterwards.
CREATE FUNCTION radix.run_ticks(jobs uuid[], planned bigint[], attempts integer[], macs text[], calls text[],
                                nexts bigint[], node text)
RETURNS TABLE (failed_at text, error_sqlstate text, error_message text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    step text;
    ran_jobs uuid[] := '{}';
    ran_planned bigint[] := '{}';
    ran_attempts integer[] := '{}';
    ran_macs text[] := '{}';
    ran_nexts bigint[] := '{}';
BEGIN
    FOR i IN 1 .. pg_catalog.cardinality(jobs) LOOP
        step := 'begin';
        failed_at := NULL;
        error_sqlstate := NULL;
        error_message := NULL;
        BEGIN
            IF CURRENT_USER OPERATOR(pg_catalog.<>) SESSION_USER THEN
                RAISE EXCEPTION 'the tick is not run here: the session''s role changed' USING ERRCODE = 'RXT02';
            END IF;
            PERFORM radix.begin_tick(jobs[i], planned[i], macs[i]);
            step := 'call';
            EXECUTE calls[i];
        EXCEPTION WHEN OTHERS THEN
            failed_at := step;
            GET STACKED DIAGNOSTICS error_sqlstate = RETURNED_SQLSTATE, error_message = MESSAGE_TEXT;
        END;
        IF failed_at IS NULL THEN
            ran_jobs := pg_catalog.array_append(ran_jobs, jobs[i]);
            ran_planned := pg_catalog.array_append(ran_planned, planned[i]);
            ran_attempts := pg_catalog.array_append(ran_attempts, attempts[i]);
            ran_macs := pg_catalog.array_append(ran_macs, macs[i]);
            ran_nexts := pg_catalog.array_append(ran_nexts, nexts[i]);
        END IF;
        RETURN NEXT;
    END LOOP;
    PERFORM radix.end_ticks(ran_jobs, ran_planned, ran_attempts, ran_macs, ran_nexts, node);
END $$;

GRANT EXECUTE ON FUNCTION radix.run_ticks(uuid[], bigint[], integer[], text[], text[], bigint[], text) TO PUBLIC;
