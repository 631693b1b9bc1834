-- A batch of ticks: started, run and ended in one transaction of the principal's.

-- end_ticks: the end of a batch's ticks: `jobs`, with their ticks (`planned`), attempts (`attempts`: the
-- state's attempt + 1, as radix.find_ticks gave them), MACs (as start_tick took them), following ticks
-- (`nexts`, NULL: none) and whether each ran (`ran`: its CALL done in this transaction); `node` hex-encoded.
-- Markers are written for the ticks that ran; RXL01 when one of them is no longer as begun (nothing is
-- written then).
CREATE OR REPLACE FUNCTION radix.end_ticks(jobs uuid[], planned bigint[], attempts integer[], macs text[], nexts bigint[],
                                ran boolean[], node text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- key lookups whatever the values, as start_tick and end_tick
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    ran_jobs uuid[] := ARRAY(SELECT u.job FROM unnest(jobs, ran) AS u(job, did) WHERE u.did);
    written integer;
BEGIN
    IF cardinality(ran_jobs) = 0 THEN
        RETURN;
    END IF;
    -- a history row left 'running' by a lease fenced before (ALTER JOB) belongs to no attempt now (as
    -- end_tick closes it; rolled back with the rest if a tick is no longer as begun)
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
        error = radix._lease_lost(jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = ANY (ran_jobs) AND h.status = 'running';
    WITH t AS (
        SELECT * FROM unnest(jobs, planned, attempts, macs, nexts, ran)
                      AS t(job, planned_ns, attempt, mac, next_ns, did)
        WHERE t.did
    ), session AS MATERIALIZED (  -- once, not once per state row
        SELECT k.secret, radix._session_key_of(k.secret, pg_backend_pid(), a.backend_start) AS key
        FROM radix.attempt_secret k, pg_stat_get_activity(pg_backend_pid()) a
    ), advanced AS (
        -- as end_tick's UPDATE, for every tick at once; the MAC is checked against the state itself
        UPDATE radix.radix_system_job_state s SET
            (status, planned_ns, due_ns, attempt, idempotency_key) =
                (SELECT * FROM radix._advanced(j.schedule_kind, t.next_ns, true, t.planned_ns, t.attempt,
                                               t.job::text || '/' || t.planned_ns::text, t.job, j.jitter_ns)),
            coalesced_ticks = s.coalesced_ticks
                              + radix._ticks_coalesced(j.schedule_kind, s.planned_ns, t.planned_ns, j.interval_ns),
            last_error = NULL, updated_at = clock_timestamp()
        FROM t, radix.jobs j, session x
        -- `= ANY (ran_jobs)`: key probes whatever the plan (a generic plan does not know the batch is small)
        WHERE s.job_id = ANY (ran_jobs) AND j.job_id = ANY (ran_jobs) AND s.job_id = t.job AND j.job_id = t.job
          AND s.status IN ('scheduled', 'retry_wait')
          AND s.request_kind IS NULL AND NOT s.via_lease AND s.attempt = t.attempt - 1
          AND radix._mac_of(x.key, radix._token_of(x.secret, t.job, t.planned_ns, s.attempt, s.updated_at)) = t.mac
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

-- start_ticks: start_tick's lock and checks for every tick of a batch at once, a row per tick (its refusal,
-- or its frame and stored arguments). A tick whose job is not WITH (batch = on) as of now (ALTER JOB ... SET
-- (batch = off) since it was found) is not started: RXT03, and the daemon runs it alone after the batch.
CREATE OR REPLACE FUNCTION radix.start_ticks(jobs uuid[], planned bigint[], macs text[])
RETURNS TABLE (ordinal integer, error_sqlstate text, error_message text, frame text,
               arguments jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
-- key lookups whatever the values (as start_tick and end_ticks)
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    locked uuid[];
    this_xact text;
    found_at integer[];
    codes text[];
    messages text[];
    batchable boolean[];
    frames text[];
    values_of jsonb[];
    at integer;
BEGIN
    locked := ARRAY(SELECT t.job_id FROM radix.tick_locks t WHERE t.job_id = ANY (jobs) FOR UPDATE SKIP LOCKED);
    this_xact := pg_current_xact_id()::text;
    -- in a later statement than the locks, so that its snapshot is newer (as start_tick)
    WITH checked AS MATERIALIZED (
        -- the identity, the owner's right and the procedure's privileges, once per principal, owner and
        -- procedure of the batch (start_tick's checks, the same order)
        SELECT d.principal_oid, d.owner_oid, d.procedure_oid, d.procedure_signature,
               e.code, e.message
        FROM (SELECT DISTINCT jj.principal_oid, jj.owner_oid, jj.procedure_oid, jj.procedure_signature
              FROM radix.jobs jj WHERE jj.job_id = ANY (locked)) d
        LEFT JOIN pg_proc p ON p.oid = d.procedure_oid AND p.prokind = 'p'
                           AND p.oid::regprocedure::text = d.procedure_signature
        CROSS JOIN LATERAL radix._refusal(d.principal_oid, d.owner_oid, p.oid, p.pronamespace) r
        LEFT JOIN LATERAL radix._refusal_error(r.refused, d.procedure_signature) e ON true
    ), session AS MATERIALIZED (  -- once, not once per state row
        SELECT k.secret, radix._session_key_of(k.secret, pg_backend_pid(), a.backend_start) AS key
        FROM radix.attempt_secret k, pg_stat_get_activity(pg_backend_pid()) a
    )
    SELECT array_agg(x.i), array_agg(x.code), array_agg(x.message), array_agg(x.batch_ticks),
           array_agg(x.frame), array_agg(x.arguments)
    INTO found_at, codes, messages, batchable, frames, values_of
    FROM (
        SELECT u.i::integer AS i, c.code, c.message, j.batch_ticks, j.arguments,
               f.text || '/' || radix._tick_frame_mac_of(x.secret, this_xact || '/' || f.text) AS frame
        FROM unnest(jobs, planned, macs) WITH ORDINALITY AS u(job, planned_ns, mac, i)
        JOIN radix.radix_system_job_state s ON s.job_id = u.job
        JOIN radix.jobs j ON j.job_id = s.job_id
        JOIN checked c ON c.principal_oid = j.principal_oid AND c.owner_oid = j.owner_oid
                      AND c.procedure_oid IS NOT DISTINCT FROM j.procedure_oid
                      AND c.procedure_signature = j.procedure_signature
        CROSS JOIN session x
        CROSS JOIN LATERAL (SELECT u.job::text || '/' || (s.attempt + 1)::text || '/' || u.planned_ns::text AS text) f
        -- `= ANY (locked)`: key probes whatever the plan (a generic plan does not know the batch is small)
        WHERE s.job_id = ANY (locked) AND j.job_id = ANY (locked)
          AND s.status IN ('scheduled', 'retry_wait') AND s.request_kind IS NULL
          AND NOT s.via_lease AND s.due_ns <= radix.to_ns(clock_timestamp())
          AND NOT (s.status = 'scheduled' AND radix._tick_missed(u.job, u.planned_ns, j.jitter_ns, j.start_deadline_ns,
                                                                  radix.to_ns(clock_timestamp())))
          AND radix._mac_of(x.key, radix._token_of(x.secret, u.job, u.planned_ns, s.attempt, s.updated_at)) = u.mac
        -- as start_tick: radix.claim_due (FOR UPDATE ... SKIP LOCKED) passes the rows by while the batch
        -- runs, and ALTER JOB (a plain UPDATE) does not wait for them
        FOR KEY SHARE OF s
    ) x;
    FOR i IN 1 .. cardinality(jobs) LOOP
        ordinal := i;
        error_sqlstate := NULL;
        error_message := NULL;
        frame := NULL;
        arguments := NULL;
        at := array_position(found_at, i);
        IF NOT (jobs[i] = ANY (locked)) THEN
            error_sqlstate := 'RXT01';
            error_message := 'the tick is not this session''s to run: another session runs it';
        ELSIF at IS NULL THEN
            error_sqlstate := 'RXT01';
            error_message := 'the tick is not this session''s to run: it ran, changed since it was found, or '
                             'missed its start deadline';
        ELSIF NOT batchable[at] THEN
            error_sqlstate := 'RXT03';
            error_message := 'the tick is not run in a batch: its job is not WITH (batch = on)';
        ELSIF codes[at] IS NOT NULL THEN
            error_sqlstate := codes[at];
            error_message := messages[at];
        ELSE
            frame := frames[at];
            arguments := values_of[at];
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- run_ticks: the batch's CALLs, in one statement of the principal's transaction, each in its own
-- subtransaction and run with its tick's arguments as $1 (EXECUTE … USING), never in the query text.
CREATE OR REPLACE FUNCTION radix.run_ticks(jobs uuid[], planned bigint[], attempts integer[], macs text[],
                                           calls text[], nexts bigint[], node text)
RETURNS TABLE (failed_at text, error_sqlstate text, error_message text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    ran boolean[] := '{}';
    refused text[];
    messages text[];
    frames text[];
    values_of jsonb[];
BEGIN
    SELECT pg_catalog.array_agg(r.error_sqlstate ORDER BY r.ordinal),
           pg_catalog.array_agg(r.error_message ORDER BY r.ordinal),
           pg_catalog.array_agg(r.frame ORDER BY r.ordinal),
           pg_catalog.array_agg(r.arguments ORDER BY r.ordinal)
    INTO refused, messages, frames, values_of
    FROM radix.start_ticks(jobs, planned, macs) r;
    FOR i IN 1 .. pg_catalog.cardinality(jobs) LOOP
        failed_at := NULL;
        error_sqlstate := refused[i];
        error_message := messages[i];
        IF CURRENT_USER OPERATOR(pg_catalog.<>) SESSION_USER THEN
            error_sqlstate := 'RXT02';
            error_message := 'the tick is not run here: the session''s role changed';
        END IF;
        IF error_sqlstate IS NOT NULL THEN
            failed_at := 'begin';
        ELSE
            PERFORM pg_catalog.set_config('radix.tick', COALESCE(frames[i], ''::pg_catalog.text), true);
            BEGIN
                EXECUTE calls[i] USING values_of[i];
            EXCEPTION WHEN OTHERS THEN
                failed_at := 'call';
                GET STACKED DIAGNOSTICS error_sqlstate = RETURNED_SQLSTATE, error_message = MESSAGE_TEXT;
            END;
        END IF;
        ran := pg_catalog.array_append(ran, failed_at IS NULL);
        RETURN NEXT;
    END LOOP;
    PERFORM pg_catalog.set_config('radix.tick', '', true);
    PERFORM radix.end_ticks(jobs, planned, attempts, macs, nexts, ran, node);
END $$;
