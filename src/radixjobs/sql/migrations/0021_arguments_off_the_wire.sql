-- 0021: no argument value in any query text a principal's session sends, and two answers that went to
-- any role (_job_exists, job_anchor_ns) now checked as the caller.
--
-- A tick's CALL carried its arguments as constants in the query text, which pg_stat_activity shows to every
-- session of the same role: code of one owner running as a principal another owner shares read the other
-- owner's arguments there. The engine's CALL now names no value (engine/definitions.py):
-- - a lone tick's or a lease attempt's DO block reads the job's stored arguments from the transaction's
--   setting `radix.arguments`, which radix.begin_tick sets once it has started the tick (a lease attempt's
--   begin sets it from radix.current_arguments(), which answers for the job whose frame this backend has);
-- - a batched tick's CALL takes them as the parameter $1 of run_ticks' EXECUTE, from radix.start_ticks,
--   which reads them with the tick's other checks.
-- A setting is seen by its own session only; a tick's code reads there its own job's arguments, which its
-- CALL gives it anyway.

-- The stored arguments (radix.jobs.arguments) of the job whose attempt or tick runs in this transaction, when
-- its definition is still `version` (the one the engine rendered the CALL from); raises otherwise. Anyone may
-- call it: only a job's own attempt has its frame, so code learns nothing its CALL did not give it.
CREATE FUNCTION radix.current_arguments(version bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    stored jsonb;
BEGIN
    SELECT j.arguments INTO stored FROM radix.jobs j
    WHERE j.job_id = (radix._frame()).job_id AND j.definition_version = version;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no arguments for this call: not inside a radixjobs attempt, or its job changed since it began'
            USING ERRCODE = '55000';
    END IF;
    RETURN stored;
END $$;
GRANT EXECUTE ON FUNCTION radix.current_arguments(bigint) TO PUBLIC;

-- begin_tick: as 0016, and the tick's stored arguments in `radix.arguments` for its DO block (until the
-- transaction ends).
CREATE OR REPLACE FUNCTION radix.begin_tick(job uuid, planned_ns bigint, mac text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM radix.start_tick(job, planned_ns, mac);
    IF r.error_sqlstate IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.error_sqlstate, MESSAGE = r.error_message;
    END IF;
    -- (never left unset: a default of the principal's own, ALTER ROLE ... SET radix.arguments, is not read)
    PERFORM set_config('radix.arguments',
                       coalesce((SELECT j.arguments::text FROM radix.jobs j WHERE j.job_id = job), '[]'), true);
END $$;

-- start_ticks: as 0017, and each started tick's stored arguments (`arguments`), for its CALL's $1.
DROP FUNCTION radix.start_ticks(uuid[], bigint[], text[]);
CREATE FUNCTION radix.start_ticks(jobs uuid[], planned bigint[], macs text[])
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
    refusals integer[];
    signatures text[];
    frames text[];
    values_of jsonb[];
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
    SELECT array_agg(x.i), array_agg(x.refused), array_agg(x.signature), array_agg(x.frame),
           array_agg(x.arguments)
    INTO found_at, refusals, signatures, frames, values_of
    FROM (
        SELECT u.i::integer AS i, c.refused, j.procedure_signature AS signature, j.arguments,
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
        arguments := NULL;
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
            arguments := values_of[at];
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

GRANT EXECUTE ON FUNCTION radix.start_ticks(uuid[], bigint[], text[]) TO PUBLIC;

-- run_ticks: as 0017, each CALL run with its tick's arguments as $1 (EXECUTE … USING).
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

-- Does `job` exist, among the jobs the caller sees (for CREATE OR REPLACE: replace it, or create it)? As the
-- caller now: a name the caller does not see goes on to admission, which refuses it as CREATE JOB would (no
-- CREATE on its schema, or already exists).
CREATE OR REPLACE FUNCTION radix._job_exists(job text) RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN EXISTS (SELECT 1 FROM radix.job_overview o, radix._split_qualified(job, 'job') AS p(parts)
               WHERE o.schema_name = p.parts[1] AND o.job_name = p.parts[2]);

-- The grid anchor of a job the caller may change (for backfill's EVERY ticks), checked as the caller.
CREATE FUNCTION radix._job_anchor_ns(creator name, job text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (SELECT s.anchor_ns FROM radix.radix_system_job_state s
            WHERE s.job_id = (radix._job_for_change(radix._caller(creator), job)).job_id);
END $$;
GRANT EXECUTE ON FUNCTION radix._job_anchor_ns(name, text) TO PUBLIC;

-- backfill_job: as 0011, the anchor read through _job_anchor_ns (as the caller).
CREATE OR REPLACE FUNCTION radix.backfill_job(job text, from_time timestamptz, to_time timestamptz,
                                   cron_ticks bigint[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    a bigint := radix.to_ns(from_time);
    b bigint := least(radix.to_ns(to_time), radix.to_ns(clock_timestamp()));
    parts text[] := radix._split_qualified(job, 'job');
    j record;
    first_k numeric;
    n numeric;
    ticks bigint[];
BEGIN
    IF from_time IS NULL OR to_time IS NULL OR from_time >= to_time THEN
        RAISE EXCEPTION 'RUN JOB ... FOR RANGE needs a start before its end' USING ERRCODE = '22023';
    END IF;
    SELECT o.job_id, o.schedule_kind, o.interval_ns, o.at_ns, radix._job_anchor_ns(current_user, job) AS anchor_ns INTO j
    FROM radix.job_overview o WHERE o.schema_name = parts[1] AND o.job_name = parts[2];
    IF j.job_id IS NULL THEN
        RAISE EXCEPTION 'job % does not exist', job USING ERRCODE = '42704';
    END IF;
    IF j.schedule_kind = 'cron' THEN
        IF cron_ticks IS NULL THEN
            RAISE EXCEPTION 'job % has a CRON schedule: its ticks are computed by radixjobs', job
                USING ERRCODE = '22023', HINT = 'Run RUN JOB ... FOR RANGE through radixjobs (sql, the Python API).';
        END IF;
        IF EXISTS (SELECT 1 FROM unnest(cron_ticks) t WHERE t IS NULL OR t < a OR t >= radix.to_ns(to_time)) THEN
            RAISE EXCEPTION 'a cron tick given is outside the range' USING ERRCODE = '22023';
        END IF;
        ticks := ARRAY(SELECT t FROM unnest(cron_ticks) t WHERE t < b);
    ELSIF cron_ticks IS NOT NULL THEN
        RAISE EXCEPTION 'ticks are given only for a CRON job' USING ERRCODE = '22023';
    ELSIF j.schedule_kind = 'at' THEN
        ticks := CASE WHEN j.at_ns >= a AND j.at_ns < b THEN ARRAY[j.at_ns] ELSE '{}' END;
    ELSE
        -- grid anchor + k*interval, k >= 1 as the schedule counts it
        first_k := greatest(1, ceil((a - j.anchor_ns)::numeric / j.interval_ns));
        n := greatest(0, ceil((b - j.anchor_ns)::numeric / j.interval_ns) - first_k);
        IF n > radix.max_requested_ticks() THEN
            RAISE EXCEPTION 'RUN JOB would queue % ticks, above the limit of % per statement', n,
                radix.max_requested_ticks() USING ERRCODE = '54000', HINT = 'Split the range.';
        END IF;
        ticks := ARRAY(SELECT (j.anchor_ns + (first_k + i) * j.interval_ns)::bigint
                       FROM generate_series(0, n - 1) AS i);
    END IF;
    RETURN cardinality(radix._request_ticks(current_user, job, ticks, 'backfill'));
END $$;

DROP FUNCTION radix.job_anchor_ns(uuid);
