-- 0017: a batch's ticks started in one statement, their frames kept in a setting with a MAC instead of a
-- row (issue #14; radix.start_ticks, engine/batches.py).
--
-- 0016 ran radix.start_tick once per tick of a batch: a security-definer call with the tick lock, the
-- state's check (its MAC, its KEY SHARE lock, the principal's identity, the owner's right and the
-- procedure's privileges) and the frame's upsert, three statements and a row written per tick. At 32 ticks
-- per batch that was the larger part of radix's server time per tick (bench/run.py tickcost --batch 32,
-- docs/hot-path.md), and the largest part of what kept the server's CPU per job above APScheduler's.
--
-- radix.start_ticks starts the whole batch at once, as end_ticks ends it: one statement locks every
-- tick's row of radix.tick_locks (FOR UPDATE SKIP LOCKED), and a later one (its snapshot newer than the
-- locks, as begin_tick's) checks every state against its MAC and holds it FOR KEY SHARE, the identity,
-- owner and privilege checks made once per distinct principal, owner and procedure of the batch. It
-- reports each tick's refusal as start_tick does, and gives each started tick its frame: the job, the
-- attempt and the tick as text, with a MAC of them and of the transaction's id, keyed by radix's secret.
--
-- The frame is what radix.current_*() and radix.once() read (radix._frame()). A batched tick's frame is
-- no longer a row: run_ticks sets it, before each CALL, in the transaction-local setting `radix.tick`, and
-- radix._frame() takes it when its MAC verifies for the current transaction, else the frame row as
-- before (lone ticks and leases keep their rows). A procedure may set `radix.tick` to anything, but
-- without the secret it cannot make a value that verifies; a value verifies in the transaction it was
-- made for only; and the only values a tick's code can read are its own (current_setting) and those a
-- direct call of start_ticks gives it for ticks of its own batch (one principal, one owner, one
-- procedure: engine/batches.py, as for the MACs it can read in current_query()). The MAC is
-- sha256(secret ‖ sha256(secret ‖ text)), so that no value can be extended into another.
--
-- A frame written for atomic ticks was never seen outside their transaction (inserted and deleted in it),
-- so nothing else read it: the finder and the claim look for live frames of lease attempts only.
--
-- The ticks after a tick are now started before its CALL: its code that ends one of them with a MAC read
-- from current_query() (begin_tick, end_tick) no longer ends it unrun. The later tick runs all the same,
-- end_ticks finds its state changed (RXL01), and the batch rolls back: each tick then runs alone, as when
-- an earlier tick is ended (tests/security/test_batches.py).

CREATE FUNCTION radix._tick_frame_mac(frame text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN (SELECT encode(sha256(k.secret || sha256(k.secret || convert_to('radix.tick/' || frame, 'UTF8'))), 'hex')
        FROM radix.attempt_secret k);
REVOKE ALL ON FUNCTION radix._tick_frame_mac(text) FROM PUBLIC;

-- start_ticks: a batch's ticks started at once. One row per tick, in order (`ordinal`, 1-based):
-- `error_sqlstate` and `error_message` NULL and `frame` the value of `radix.tick` for its CALL when it
-- started, else start_tick's refusal (RXT01: not this session's tick; 42501, 42883: refused), nothing
-- written for it. Errors other than those raise.
CREATE FUNCTION radix.start_ticks(jobs uuid[], planned bigint[], macs text[])
RETURNS TABLE (ordinal integer, error_sqlstate text, error_message text, frame text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- key lookups whatever the values (as start_tick and end_ticks)
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    locked uuid[];
    this_xact text;
    found_at integer[];
    refusals integer[];
    signatures text[];
    frames text[];
    at integer;
BEGIN
    locked := ARRAY(SELECT t.job_id FROM radix.tick_locks t WHERE t.job_id = ANY (jobs) FOR UPDATE SKIP LOCKED);
    this_xact := pg_current_xact_id()::text;
    -- in a later statement than the locks, so that its snapshot is newer (as begin_tick, 0013)
    WITH checked AS MATERIALIZED (
        -- the identity, the owner's right and the procedure's privileges, once per principal, owner and
        -- procedure of the batch (start_tick's checks, the same order)
        SELECT d.principal_oid, d.owner_oid, d.procedure_oid, d.procedure_signature,
               CASE
                   WHEN (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user)
                        IS DISTINCT FROM d.principal_oid THEN 1
                   WHEN NOT coalesce((
                       SELECT CASE WHEN a.rolsuper THEN true
                                   WHEN t.rolsuper THEN false
                                   WHEN d.owner_oid = d.principal_oid THEN true
                                   WHEN current_setting('server_version_num')::integer >= 160000
                                       THEN pg_has_role(d.owner_oid, d.principal_oid, 'SET')
                                   ELSE pg_has_role(d.owner_oid, d.principal_oid, 'MEMBER') END
                       FROM pg_roles a, pg_roles t WHERE a.oid = d.owner_oid AND t.oid = d.principal_oid), false)
                       THEN 2
                   WHEN p.oid IS NULL THEN 3
                   WHEN NOT has_database_privilege(d.principal_oid, current_database(), 'CONNECT')
                        OR NOT has_schema_privilege(d.principal_oid, p.pronamespace, 'USAGE')
                        OR NOT has_function_privilege(d.principal_oid, p.oid, 'EXECUTE') THEN 4
                   ELSE 0
               END AS refused
        FROM (SELECT DISTINCT jj.principal_oid, jj.owner_oid, jj.procedure_oid, jj.procedure_signature
              FROM radix.jobs jj WHERE jj.job_id = ANY (locked)) d
        LEFT JOIN pg_proc p ON p.oid = d.procedure_oid AND p.prokind = 'p'
                           AND p.oid::regprocedure::text = d.procedure_signature
    ), session AS MATERIALIZED (  -- once, not once per state row
        SELECT k.secret, sha256(k.secret || int4send(pg_backend_pid()) || timestamptz_send(a.backend_start)) AS key
        FROM radix.attempt_secret k, pg_stat_get_activity(pg_backend_pid()) a
    )
    SELECT array_agg(x.i), array_agg(x.refused), array_agg(x.signature), array_agg(x.frame)
    INTO found_at, refusals, signatures, frames
    FROM (
        SELECT u.i::integer AS i, c.refused, j.procedure_signature AS signature,
               f.text || '/' || radix._tick_frame_mac(this_xact || '/' || f.text) AS frame
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
          -- the MAC of radix._tick_token(job, planned, s.attempt, s.updated_at), inlined
          AND encode(sha256(x.key || uuid_send(encode(substring(sha256(x.secret || uuid_send(u.job)
                                                                       || int8send(u.planned_ns)
                                                                       || int4send(s.attempt)
                                                                       || timestamptz_send(s.updated_at))
                                                                FROM 1 FOR 16), 'hex')::uuid)), 'hex') = u.mac
        -- as start_tick: radix.claim_due (FOR UPDATE ... SKIP LOCKED) passes the rows by while the batch
        -- runs, and ALTER JOB (a plain UPDATE) does not wait for them
        FOR KEY SHARE OF s
    ) x;
    FOR i IN 1 .. cardinality(jobs) LOOP
        ordinal := i;
        error_sqlstate := NULL;
        error_message := NULL;
        frame := NULL;
        at := array_position(found_at, i);
        IF NOT (jobs[i] = ANY (locked)) THEN
            error_sqlstate := 'RXT01';
            error_message := 'the tick is not this session''s to run: another session runs it';
        ELSIF at IS NULL THEN
            error_sqlstate := 'RXT01';
            error_message := 'the tick is not this session''s to run: it ran, or changed since it was found';
        ELSIF refusals[at] = 1 THEN
            error_sqlstate := '42501';
            error_message := 'permission denied: the attempt is not logged in as its principal';
        ELSIF refusals[at] = 2 THEN
            error_sqlstate := '42501';
            error_message := 'permission denied: the job owner may no longer act as its principal';
        ELSIF refusals[at] = 3 THEN
            error_sqlstate := '42883';
            error_message := format('procedure %s no longer exists', signatures[at]);
        ELSIF refusals[at] = 4 THEN
            error_sqlstate := '42501';
            error_message := format('permission denied for procedure %s', signatures[at]);
        ELSE
            frame := frames[at];
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

GRANT EXECUTE ON FUNCTION radix.start_ticks(uuid[], bigint[], text[]) TO PUBLIC;

-- The frame of the running tick or attempt: a batched tick's from `radix.tick` when its MAC verifies for
-- this transaction, else this backend's frame row (lone ticks, leases), as before.
CREATE OR REPLACE FUNCTION radix._frame() RETURNS radix.attempt_frames
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    value text := current_setting('radix.tick', true);
    xact text := pg_current_xact_id_if_assigned()::text;
    payload text;
    parts text[];
    tick radix.attempt_frames;
BEGIN
    IF xact IS NOT NULL AND length(value) > 65 THEN
        payload := left(value, -65);
        IF right(value, 65) = '/' || radix._tick_frame_mac(xact || '/' || payload) THEN
            parts := string_to_array(payload, '/');  -- made by start_ticks: job, attempt, tick
            tick.pid := pg_backend_pid();
            tick.job_id := parts[1]::uuid;
            tick.attempt := parts[2]::integer;
            tick.planned_ns := parts[3]::bigint;
            tick.idempotency_key := parts[1] || '/' || parts[3];
            RETURN tick;
        END IF;
    END IF;
    RETURN (SELECT f FROM radix.attempt_frames f
            WHERE f.pid = pg_backend_pid() AND EXISTS (
                SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start));
END $$;

-- run_ticks: as 0016, its ticks started by one radix.start_ticks; each tick's frame set in `radix.tick`
-- before its CALL, and cleared after the last.
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
BEGIN
    SELECT pg_catalog.array_agg(r.error_sqlstate ORDER BY r.ordinal),
           pg_catalog.array_agg(r.error_message ORDER BY r.ordinal),
           pg_catalog.array_agg(r.frame ORDER BY r.ordinal)
    INTO refused, messages, frames
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
                EXECUTE calls[i];
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
