-- 0010: long jobs (per-job timeout up to 7 days, renewed leases) and admission defects (issue #12,
-- sections 2 and 4).
--
-- Timeout. A job's deadline (jobs.deadline_ms, "timeout" in CREATE JOB ... WITH (timeout = '2 hours')) may
-- be up to radix.max_timeout_ms() (7 days); the default stays 240 s. A value out of range is refused with
-- one line naming it and the limit (22023), never a raw check constraint.
--
-- Leases. A claim's lease lasts `lease_seconds` (the engine's --lease-seconds, default 300) and the engine
-- renews the leases of the attempts it is running every third of that (radix.renew_leases, fenced by the
-- lease token and by the node being alive). The lease therefore bounds how long a dead node's claim
-- blocks the job, not how long an attempt may run. A renewal that finds a lease gone (ALTER JOB, DROP JOB
-- CASCADE, the node declared dead) makes the engine cancel that attempt.
--
-- State machine. Re-arming a job (ALTER JOB) closes the history row of an attempt still running under
-- the old definition (it can no longer finalise: its token is gone), so a later claim of the same tick
-- and attempt number cannot collide with it on radix_system_job_history_running; a claim also closes
-- any such stale row it meets (healing databases wedged before this migration, which closes them too).
-- A one-time job that completed stays complete through DISABLE / ENABLE: it never runs twice under one
-- idempotency key. DROP JOB (RESTRICT) refuses only while an attempt really runs: a claim held by a live
-- node, a live frame, or a row an attempt holds locked; a dead node's leftover lease does not count.
--
-- Schedules. EVERY intervals under 1 second are refused (the grammar's units start at seconds).
--
-- Arguments. Defaults are frozen at CREATE JOB: every input parameter with a default that the CALL does
-- not give is bound to its default's value, evaluated once at admission with the creator's rights and
-- converted like a given constant (a default of now() is the creation time). VARIADIC and polymorphic
-- parameters keep their run-time default.

-- -- limits ----------------------------------------------------------------------------------------

CREATE FUNCTION radix.max_timeout_ms() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 604800000;  -- 7 days
COMMENT ON FUNCTION radix.max_timeout_ms() IS 'radixjobs: the longest timeout (deadline) a job may have, in ms';
GRANT EXECUTE ON FUNCTION radix.max_timeout_ms() TO PUBLIC;

ALTER TABLE radix.jobs DROP CONSTRAINT jobs_deadline_ms_check;
ALTER TABLE radix.jobs ADD CONSTRAINT jobs_deadline_ms_check CHECK (deadline_ms BETWEEN 1 AND 604800000);

-- Raise unless `ms` is a valid timeout; `shown` is how the caller wrote it.
CREATE FUNCTION radix._check_timeout(ms numeric, shown text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF ms IS NULL OR ms OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'timeout % must be at least 1 millisecond', shown USING ERRCODE = '22023';
    END IF;
    IF ms OPERATOR(pg_catalog.>) radix.max_timeout_ms() THEN
        RAISE EXCEPTION 'timeout % is above the maximum of 7 days', shown USING ERRCODE = '22023';
    END IF;
    RETURN pg_catalog.round(ms)::integer;
END $$;
GRANT EXECUTE ON FUNCTION radix._check_timeout(numeric, text) TO PUBLIC;

-- -- heal: history rows left 'running' by an attempt whose state was re-armed ---------------------

UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
    error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                               'category', 'connection',
                               'detail', jsonb_build_object('reason', 'job redefined'))
WHERE h.status = 'running' AND NOT EXISTS (
    SELECT 1 FROM radix.radix_system_job_state s
    WHERE s.job_id = h.job_id AND s.status = 'running' AND s.planned_ns = h.planned_ns
      AND s.attempt = h.attempt);

-- -- replaced from 0002 ----------------------------------------------------------------------------

-- As 0002, and an EVERY interval of less than one second is refused.
CREATE OR REPLACE FUNCTION radix._normalise_schedule(s jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
AS $$
DECLARE
    iv interval;
    every_ns numeric;
    out jsonb;
BEGIN
    IF s ? 'every_ns' OR s ? 'every' THEN
        IF s ? 'every_ns' THEN
            every_ns := (s->>'every_ns')::numeric;
        ELSE
            iv := (s->>'every')::interval;
            IF extract(month FROM iv) <> 0 OR extract(year FROM iv) <> 0 THEN
                RAISE EXCEPTION 'calendar units (month, year) are not allowed in a job interval'
                    USING ERRCODE = '22007';
            END IF;
            every_ns := extract(epoch FROM iv) * 1000000000;
        END IF;
        IF every_ns IS NULL OR every_ns <= 0 THEN
            RAISE EXCEPTION 'interval must be positive' USING ERRCODE = '22007';
        END IF;
        IF every_ns < 1000000000 THEN
            RAISE EXCEPTION 'interval must be at least 1 second' USING ERRCODE = '22023';
        END IF;
        IF every_ns > 3162240000000000000 THEN  -- 100 years
            RAISE EXCEPTION 'interval too large' USING ERRCODE = '22008';
        END IF;
        out := jsonb_build_object('kind', 'every', 'interval_ns', every_ns::bigint);
        IF s ? 'starting_at_ns' THEN
            out := out || jsonb_build_object('starting_at_ns', (s->>'starting_at_ns')::bigint);
        ELSIF s ? 'starting_at' THEN
            out := out || jsonb_build_object('starting_at_ns', radix.to_ns((s->>'starting_at')::timestamptz));
        END IF;
    ELSIF s ? 'at_ns' THEN
        out := jsonb_build_object('kind', 'at', 'at_ns', (s->>'at_ns')::bigint);
    ELSIF s ? 'at' THEN
        out := jsonb_build_object('kind', 'at', 'at_ns', radix.to_ns((s->>'at')::timestamptz));
    ELSIF s ? 'cron' THEN
        IF array_length(regexp_split_to_array(btrim(s->>'cron'), '\s+'), 1) NOT IN (5, 6)
           OR btrim(s->>'cron') !~ '^[0-9A-Za-z*/,?#LW\s-]+$' THEN
            RAISE EXCEPTION 'invalid cron expression %: 5 or 6 fields expected', quote_literal(s->>'cron')
                USING ERRCODE = '22007';
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = coalesce(s->>'time_zone', 'UTC')) THEN
            RAISE EXCEPTION 'unknown time zone %', quote_literal(s->>'time_zone') USING ERRCODE = '22023';
        END IF;
        out := jsonb_build_object('kind', 'cron', 'cron_expression', btrim(s->>'cron'),
                                  'cron_time_zone', coalesce(s->>'time_zone', 'UTC'));
    ELSE
        RAISE EXCEPTION 'schedule must have one of every, at or cron' USING ERRCODE = '22023';
    END IF;
    RETURN out;
EXCEPTION
    WHEN invalid_datetime_format OR datetime_field_overflow OR invalid_text_representation
         OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'invalid schedule: %', SQLERRM USING ERRCODE = SQLSTATE;
END $$;

-- Public entry point: as 0002, with `timeout` (an interval, units as in SCHEDULE, at most 7 days), which
-- wins over deadline_ms when given. Signature changed: dropped and created again.
DROP FUNCTION radix.create_job(text, jsonb, text, text, jsonb, boolean, boolean, integer);
CREATE FUNCTION radix.create_job(job text, schedule jsonb, run_as text, procedure text,
                                 arguments jsonb DEFAULT '[]', enabled boolean DEFAULT true,
                                 if_not_exists boolean DEFAULT false, deadline_ms integer DEFAULT 240000,
                                 timeout interval DEFAULT NULL)
RETURNS uuid LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    args jsonb := radix._normalise_arguments(arguments);
    proc_parts text[] := radix._split_qualified(procedure, 'procedure');
    existing uuid;
    ms integer := deadline_ms;
BEGIN
    IF args IS NULL THEN
        RAISE EXCEPTION 'arguments must be a JSON array or object' USING ERRCODE = '22023';
    END IF;
    IF timeout IS NOT NULL THEN
        IF extract(month FROM timeout) <> 0 OR extract(year FROM timeout) <> 0 THEN
            RAISE EXCEPTION 'calendar units (month, year) are not allowed in a timeout' USING ERRCODE = '22023';
        END IF;
        ms := radix._check_timeout(extract(epoch FROM timeout) * 1000, quote_literal(timeout::text));
    ELSIF ms IS NOT NULL THEN
        ms := radix._check_timeout(ms, ms::text || ' ms');
    END IF;
    existing := radix._admit(current_user, job, run_as, if_not_exists);
    IF existing IS NOT NULL THEN
        RETURN existing;
    END IF;
    RETURN radix._create_job(current_user, job, schedule, run_as, procedure,
                             radix._resolve_call(proc_parts[1], proc_parts[2], args), enabled,
                             if_not_exists, ms);
END $$;
GRANT EXECUTE ON FUNCTION radix.create_job(text, jsonb, text, text, jsonb, boolean, boolean, integer, interval)
    TO PUBLIC;

-- -- replaced from 0006 ----------------------------------------------------------------------------

-- As 0006, and then every input parameter with a default that was not given is bound to its default's
-- value, evaluated now (the creator's rights, this function's search_path, which also deparses it) and
-- converted to the parameter's type like a given constant. It is passed by position when every earlier
-- parameter is, else by name; an unnamed parameter that can be neither is refused. VARIADIC and
-- polymorphic parameters keep their run-time default.
CREATE OR REPLACE FUNCTION radix._bind_arguments(proc oid, args jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a record;
    param record;
    bound jsonb := '[]';
    expr text;
    target_type oid;
    converted text;
    positional_prefix boolean := true;
BEGIN
    FOR a IN SELECT e, n::integer AS n FROM jsonb_array_elements(args) WITH ORDINALITY AS x(e, n) LOOP
        IF a.e->>'name' IS NULL THEN
            SELECT * INTO param
            FROM (SELECT p.*, row_number() OVER (ORDER BY p.ord) AS k
                  FROM radix._procedure_parameters(proc) p) q
            WHERE q.k = a.n OR (q.mode = 'v' AND q.k < a.n) ORDER BY q.k DESC LIMIT 1;
        ELSE
            SELECT * INTO param FROM radix._procedure_parameters(proc) WHERE argname = a.e->>'name';
        END IF;
        expr := radix._constant_sql(a.e);
        target_type := param.argtype;
        IF param.mode = 'v' AND a.e->>'name' IS NULL THEN
            target_type := coalesce(nullif((SELECT typelem FROM pg_type WHERE oid = target_type), 0),
                                    target_type);
        END IF;
        IF (SELECT typtype = 'p' FROM pg_type WHERE oid = target_type) THEN
            -- polymorphic parameter: the constant keeps its own type (unknown literals become text)
            EXECUTE format('SELECT pg_typeof(%s)::oid', expr) INTO target_type;
            IF target_type = 'unknown'::regtype THEN target_type := 'text'::regtype; END IF;
        END IF;
        BEGIN
            EXECUTE format('SELECT radix._canonical_text((%s)::%s)', expr, format_type(target_type, NULL))
                INTO converted;
        EXCEPTION WHEN data_exception OR invalid_text_representation OR cannot_coerce
                       OR datatype_mismatch OR invalid_datetime_format THEN
            RAISE EXCEPTION 'argument % (%): %', a.n,
                coalesce(quote_ident(param.argname), 'positional'), SQLERRM
                USING ERRCODE = SQLSTATE,
                      HINT = format('the parameter is declared %s', format_type(param.argtype, NULL));
        END;
        bound := bound || jsonb_build_object(
            'position', param.ord, 'name', param.argname, 'by_name', a.e->>'name' IS NOT NULL,
            'type', format_type(target_type, NULL), 'type_oid', target_type, 'value', converted);
    END LOOP;

    -- frozen defaults, in parameter order
    FOR param IN SELECT * FROM radix._procedure_parameters(proc) p ORDER BY p.ord LOOP
        IF EXISTS (SELECT 1 FROM jsonb_array_elements(bound) AS x(b)
                   WHERE (b->>'position')::integer = param.ord) THEN
            positional_prefix := positional_prefix AND NOT EXISTS (
                SELECT 1 FROM jsonb_array_elements(bound) AS x(b)
                WHERE (b->>'position')::integer = param.ord AND (b->>'by_name')::boolean);
            CONTINUE;
        END IF;
        IF NOT param.has_default OR param.mode = 'v'
           OR (SELECT typtype = 'p' FROM pg_type WHERE oid = param.argtype) THEN
            positional_prefix := false;
            CONTINUE;
        END IF;
        IF NOT positional_prefix AND nullif(param.argname, '') IS NULL THEN
            RAISE EXCEPTION 'cannot freeze the default of unnamed parameter % of %: pass it explicitly',
                param.ord, proc::regprocedure USING ERRCODE = '0A000',
                HINT = 'A job stores every default as an argument; an unnamed parameter can only be passed by position.';
        END IF;
        expr := pg_get_function_arg_default(proc, param.ord);
        BEGIN
            EXECUTE format('SELECT radix._canonical_text((%s)::%s)', expr, format_type(param.argtype, NULL))
                INTO converted;
        EXCEPTION WHEN data_exception OR invalid_text_representation OR cannot_coerce
                       OR datatype_mismatch OR invalid_datetime_format THEN
            RAISE EXCEPTION 'default of parameter % (%): %', param.ord,
                coalesce(quote_ident(nullif(param.argname, '')), 'positional'), SQLERRM
                USING ERRCODE = SQLSTATE,
                      HINT = format('the parameter is declared %s', format_type(param.argtype, NULL));
        END;
        bound := bound || jsonb_build_object(
            'position', param.ord, 'name', param.argname, 'by_name', NOT positional_prefix,
            'type', format_type(param.argtype, NULL), 'type_oid', param.argtype, 'value', converted);
    END LOOP;
    PERFORM radix._check_argument_size(bound);
    PERFORM radix._check_output_arguments(proc, bound);
    RETURN jsonb_build_object('procedure_oid', proc, 'signature', proc::regprocedure::text,
                              'arguments', bound);
END $$;

-- As 0006, and the deadline is checked against radix.max_timeout_ms() with a one-line error.
CREATE OR REPLACE FUNCTION radix._create_job(creator name, job text, schedule jsonb, run_as text, procedure text,
                                             binding jsonb, enabled boolean, if_not_exists boolean,
                                             deadline_ms integer)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    job_parts text[] := radix._split_qualified(job, 'job');
    proc_parts text[] := radix._split_qualified(procedure, 'procedure');
    existing uuid := radix._check_admission(caller, job_parts, run_as, if_not_exists);
    principal pg_roles;
    sched jsonb;
    bound jsonb;
    ms integer := radix._check_timeout(coalesce(deadline_ms, 240000),
                                       coalesce(deadline_ms, 240000)::text || ' ms');
    j radix.jobs;
BEGIN
    IF existing IS NOT NULL THEN
        RETURN existing;
    END IF;
    SELECT * INTO principal FROM pg_roles WHERE rolname = run_as;
    IF NOT has_language_privilege(principal.oid, 'plpgsql', 'USAGE') THEN
        RAISE EXCEPTION 'role % cannot use PL/pgSQL, which runs its jobs', quote_ident(run_as)
            USING ERRCODE = '42501',
                  HINT = format('GRANT USAGE ON LANGUAGE plpgsql TO %s', quote_ident(run_as));
    END IF;
    bound := radix._check_binding(proc_parts[1], proc_parts[2], binding);
    sched := radix._normalise_schedule(schedule);

    INSERT INTO radix.jobs (schema_name, job_name, owner_oid, owner_name, principal_oid, principal_name,
                            procedure_oid, procedure_signature, arguments, schedule_kind, interval_ns,
                            starting_at_ns, at_ns, cron_expression, cron_time_zone, enabled, deadline_ms)
    VALUES (job_parts[1], job_parts[2], caller, (SELECT rolname FROM pg_roles WHERE oid = caller),
            principal.oid, principal.rolname, (bound->>'procedure_oid')::oid, bound->>'signature',
            bound->'arguments', sched->>'kind', (sched->>'interval_ns')::bigint,
            (sched->>'starting_at_ns')::bigint, (sched->>'at_ns')::bigint, sched->>'cron_expression',
            sched->>'cron_time_zone', coalesce(enabled, true), ms)
    RETURNING * INTO j;
    PERFORM radix._arm_state(j);
    RETURN j.job_id;
END $$;

-- -- replaced from 0008 ----------------------------------------------------------------------------

-- As 0008, and: an attempt still running under the old definition has its history row closed
-- (lease_lost: it cannot finalise, its token is gone), so no claim collides with it later; a one-time
-- job whose tick succeeded stays complete (no due time) whatever ENABLE / DISABLE say.
CREATE OR REPLACE FUNCTION radix._arm_state(j radix.jobs) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    anchor bigint := coalesce(j.starting_at_ns, now_ns);
    planned bigint;
    done boolean := false;
    new_status text := CASE WHEN j.enabled THEN 'scheduled' ELSE 'disabled' END;
BEGIN
    IF j.schedule_kind = 'every' THEN
        -- first grid point anchor + k*interval (k >= 1) after both the anchor and now
        planned := anchor + j.interval_ns * greatest(1, (greatest(now_ns - anchor, 0) / j.interval_ns) + 1);
    ELSIF j.schedule_kind = 'at' THEN
        planned := j.at_ns;  -- already past: due at once
        done := EXISTS (SELECT 1 FROM radix.radix_system_job_state s
                        WHERE s.job_id = j.job_id AND s.status = 'complete')
             OR EXISTS (SELECT 1 FROM radix.radix_system_job_history h
                        WHERE h.job_id = j.job_id AND h.planned_ns = j.at_ns AND h.status = 'succeeded');
        IF done THEN
            new_status := 'complete';
        END IF;
    END IF;
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
        error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                                   'category', 'connection',
                                   'detail', jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = j.job_id AND h.status = 'running';
    -- a plain UPDATE (NO KEY UPDATE lock) does not wait for a running attempt's KEY SHARE lock;
    -- that attempt then finds its lease gone and rolls back
    UPDATE radix.radix_system_job_state SET
        definition_version = j.definition_version,
        status = new_status,
        anchor_ns = anchor, planned_ns = planned,
        due_ns = CASE WHEN new_status = 'scheduled' THEN coalesce(planned, now_ns) END,
        attempt = 0,
        idempotency_key = CASE WHEN done THEN j.job_id::text || '/' || j.at_ns::text END,
        lease_node = NULL, lease_token = NULL,
        lease_expires_at = NULL, last_error = CASE WHEN done THEN last_error END,
        updated_at = clock_timestamp()
    WHERE job_id = j.job_id;
    IF NOT FOUND THEN
        INSERT INTO radix.radix_system_job_state
            (job_id, definition_version, status, anchor_ns, planned_ns, due_ns, attempt)
        VALUES (j.job_id, j.definition_version, new_status, anchor, planned,
                CASE WHEN new_status = 'scheduled' THEN coalesce(planned, now_ns) END, 0);
    END IF;
    PERFORM radix._hint('radix_jobs', j.job_id::text);
END $$;

-- As 0008, and RESTRICT refuses only while an attempt really runs: the claim is held by a live node, or
-- an attempt's backend still runs (a live frame, or the state row locked by an atomic attempt). A claim
-- left by a killed node with nothing running does not count.
CREATE OR REPLACE FUNCTION radix._drop_job(creator name, job text, if_exists boolean, cascade boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    prior_timeout text := radix._bound_lock_wait();
    caller oid := radix._caller(creator);
    j radix.jobs;
    s radix.radix_system_job_state;
BEGIN
    BEGIN
        j := radix._find_job(job);
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'job % is being changed by another transaction; try again', job USING ERRCODE = '55P03',
            HINT = 'Another session holds it in an open transaction (see pg_stat_activity).';
    END;
    -- the DELETE below may still wait for a running atomic attempt (its KEY SHARE lock), as before:
    -- that wait is bounded by the attempt's deadline
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    IF j.job_id IS NULL THEN
        IF if_exists THEN
            RAISE NOTICE 'job % does not exist, skipping', job;
            RETURN false;
        END IF;
        RAISE EXCEPTION 'job % does not exist', job USING ERRCODE = '42704';
    END IF;
    PERFORM radix._check_job_owner(j, caller);
    SELECT * INTO s FROM radix.radix_system_job_state WHERE job_id = j.job_id;
    IF NOT cascade AND s.status = 'running' AND (
           (s.lease_expires_at > clock_timestamp() AND radix.node_alive(s.lease_node))
           OR radix.job_has_live_frame(j.job_id)
           -- an atomic attempt (or a claim in progress) holds the row: it cannot be locked now
           OR NOT EXISTS (SELECT 1 FROM radix.radix_system_job_state x WHERE x.job_id = j.job_id
                          FOR UPDATE SKIP LOCKED)) THEN
        RAISE EXCEPTION 'cannot drop job %.%: an attempt is running', quote_ident(j.schema_name),
            quote_ident(j.job_name) USING ERRCODE = '55006',
            HINT = 'Wait for it to finish, or use DROP JOB ... CASCADE.';
    END IF;
    DELETE FROM radix.jobs WHERE job_id = j.job_id;
    PERFORM radix._hint('radix_jobs', j.job_id::text);
    RETURN true;
END $$;

-- -- replaced from 0007: claims take the lease length --------------------------------------------

-- As 0007, with the lease length (`lease_seconds`, the engine's --lease-seconds) instead of a fixed 5
-- minutes; and a fresh claim closes any history row of its job still marked running (left by an attempt
-- whose state was re-armed before 0009), which would otherwise collide with the new attempt's row.
DROP FUNCTION radix.claim_due(text, integer, boolean, integer);
CREATE FUNCTION radix.claim_due(node text, max_claims integer, with_cron boolean DEFAULT true,
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
            lease_expires_at = now_ts + lease,
            due_ns = radix.to_ns(now_ts + lease),
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
REVOKE ALL ON FUNCTION radix.claim_due(text, integer, boolean, integer, integer) FROM PUBLIC;

-- -- new: lease renewal ------------------------------------------------------------------------------

-- Extend the leases `node` holds for the attempts it is running (their tokens) to `lease_seconds` from
-- now; returns the tokens still held. A token missing from the result is a lost lease (ALTER JOB, DROP
-- JOB CASCADE, or another node took the claim): the engine cancels that attempt. Nothing is renewed
-- while the node is not alive (its control session gone): other nodes may then take its claims.
-- A row locked by a writer (an attempt finalising, a claimer) is skipped, never waited for: it counts as
-- held (as this statement's snapshot sees it) and is renewed next time if it still is. FOR NO KEY UPDATE
-- does not conflict with the KEY SHARE lock a running atomic attempt holds.
CREATE FUNCTION radix.renew_leases(node text, tokens uuid[], lease_seconds integer)
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
REVOKE ALL ON FUNCTION radix.renew_leases(text, uuid[], integer) FROM PUBLIC;
CREATE INDEX radix_system_job_state_token ON radix.radix_system_job_state (lease_token)
    WHERE status = 'running';

-- -- replaced from 0005: what `jobs show` says of the next run --------------------------------------

-- next_run_at is the tick a live job runs next: none for a disabled, completed or failed one (it showed
-- the last tick, possibly years past); for retry_wait, when the retry is due.
CREATE OR REPLACE VIEW radix.job_overview WITH (security_barrier) AS
SELECT j.job_id, quote_ident(j.schema_name) || '.' || quote_ident(j.job_name) AS name,
       j.schema_name, j.job_name, j.owner_name AS owner, j.principal_name AS principal,
       j.procedure_signature AS procedure, j.arguments,
       CASE j.schedule_kind
           WHEN 'every' THEN 'EVERY ' || (j.interval_ns / 1000 * interval '1 microsecond')::text
                || coalesce(' STARTING AT ' || radix.from_ns(j.starting_at_ns)::text, '')
           WHEN 'at' THEN 'AT ' || radix.from_ns(j.at_ns)::text
           ELSE 'CRON ' || quote_literal(j.cron_expression) || ' TIME ZONE ' || quote_literal(j.cron_time_zone)
       END AS schedule,
       j.schedule_kind, j.interval_ns, j.starting_at_ns, j.at_ns, j.cron_expression, j.cron_time_zone,
       j.enabled, j.definition_version, j.deadline_ms, j.non_atomic, j.created_at,
       s.status, s.planned_ns,
       CASE s.status WHEN 'scheduled' THEN radix.from_ns(s.planned_ns)
                     WHEN 'running' THEN radix.from_ns(s.planned_ns)
                     WHEN 'retry_wait' THEN radix.from_ns(s.due_ns) END AS next_run_at,
       s.attempt, s.due_ns,
       s.idempotency_key, s.lease_node, s.lease_expires_at, s.coalesced_ticks, s.last_error
FROM radix.jobs j LEFT JOIN radix.radix_system_job_state s USING (job_id)
WHERE radix._owner_visible(j.owner_oid);
