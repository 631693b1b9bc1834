-- Hooks on failure: WITH (on_failure = 'schema.proc') resolved and checked at admission, the hook owed queued
-- with a tick's terminal failure, and the radix_events notification of that failure.
--
-- The hook is a request of the failed job itself (radix.job_requests, kind 'on_failure', planned at the failed
-- tick's time): it is queued in the transaction that records the failure, promoted into the state row as any
-- request (radix._promote_request, hooks before the other requests), claimed and run on the lease path as the
-- job's principal (radix.begin_atomic checks the hook's procedure, radix.current_arguments hands it the
-- failure document), and ends as a request does (radix._advance). A hook's own failure queues no hook.

-- WITH (on_failure = …) as the caller resolves it: the procedure CALL app.alert(NULL::jsonb) would pick,
-- added to the normalised options as "on_failure_binding" (radix._resolve_call, on the caller's side, as a
-- job's CALL is resolved). The definer side checks it against the catalog (radix._check_hook).
CREATE OR REPLACE FUNCTION radix._resolve_hook(opts jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    parts text[];
BEGIN
    IF NOT coalesce(opts ? 'on_failure', false) THEN
        RETURN opts;
    END IF;
    parts := radix._split_qualified(opts->>'on_failure', 'procedure');
    BEGIN
        RETURN opts || jsonb_build_object('on_failure_binding',
            radix._resolve_call(parts[1], parts[2], '[{"kind": "typed", "type": "jsonb", "value": null}]'));
    EXCEPTION WHEN undefined_function OR ambiguous_function THEN
        RAISE EXCEPTION 'option on_failure: no procedure %.% taking one jsonb argument', quote_ident(parts[1]),
            quote_ident(parts[2]) USING ERRCODE = SQLSTATE,
            HINT = 'An on_failure procedure takes exactly one argument, the failure document (jsonb).';
    END;
END $$;

-- The definer side's check of an on_failure binding (radix._resolve_hook's): the procedure is `qualified`
-- and takes exactly one argument, an IN jsonb. Returns {oid, signature}, taken from the catalog. Whether the
-- principal may execute it is checked before every run of the hook (radix._refusal), as for the job's CALL.
CREATE OR REPLACE FUNCTION radix._check_hook(qualified text, binding jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    parts text[] := radix._split_qualified(qualified, 'procedure');
    proc oid;
BEGIN
    IF jsonb_typeof(binding) = 'object' AND jsonb_typeof(binding->'procedure_oid') IN ('number', 'string') THEN
        SELECT p.oid INTO proc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE p.oid = (binding->>'procedure_oid')::oid AND p.prokind = 'p'
          AND n.nspname = parts[1] AND p.proname = parts[2];
    END IF;
    IF proc IS NULL THEN
        RAISE EXCEPTION 'invalid on_failure binding for procedure %.%', quote_ident(parts[1]), quote_ident(parts[2])
            USING ERRCODE = '22023';
    END IF;
    IF (SELECT count(*) FROM radix._procedure_parameters(proc)) <> 1
       OR NOT EXISTS (SELECT 1 FROM radix._procedure_parameters(proc) x
                      WHERE x.mode = 'i' AND x.argtype = 'jsonb'::regtype) THEN
        RAISE EXCEPTION 'option on_failure: % must take exactly one argument, of type jsonb', proc::regprocedure
            USING ERRCODE = '42P13',
            HINT = 'An on_failure procedure takes the failure document: CREATE PROCEDURE ...(failure jsonb).';
    END IF;
    RETURN jsonb_build_object('oid', proc, 'signature', proc::regprocedure::text);
END $$;

-- What an on_failure procedure receives: the job (its qualified name and id), the failed tick (planned time,
-- its idempotency key, what ran it: 'schedule', 'run', 'backfill', …), its last attempt and the job's
-- max_attempts, when it failed, and the error as recorded (category, kind, SQLSTATE, the redacted message).
CREATE OR REPLACE FUNCTION radix._failure_document(j radix.jobs, s radix.radix_system_job_state, error jsonb)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN jsonb_build_object(
    'job', quote_ident(j.schema_name) || '.' || quote_ident(j.job_name), 'job_id', j.job_id,
    'planned_at', radix.from_ns(s.planned_ns), 'planned_ns', s.planned_ns, 'idempotency_key', s.idempotency_key,
    'run_kind', coalesce(s.request_kind, 'schedule'), 'attempt', s.attempt, 'max_attempts', j.max_attempts,
    'status', 'failed', 'failed_at', clock_timestamp(),
    'error', jsonb_build_object('category', error->'category', 'kind', error->'kind',
                                'sqlstate', error->'sqlstate', 'message', error->'message'));

-- The event every role may LISTEN to on channel radix_events (any role can LISTEN on any channel): the job's id,
-- the status, what ran the tick, the error's category, the attempt and the tick's planned time; never a name, an
-- argument or an error text. A hint (radix._hint): skipped while the notification queue is half full.
CREATE OR REPLACE FUNCTION radix._event(job uuid, status text, run_kind text, category text, attempt integer,
                                       planned_ns bigint) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
BEGIN ATOMIC
    SELECT radix._hint('radix_events', jsonb_build_object(
        'job_id', job, 'status', status, 'run_kind', run_kind, 'category', category, 'attempt', attempt,
        'planned_ns', planned_ns)::text);
END;

-- A tick's attempt failed for good (after its retries): `s` is the state row as that attempt left it, before
-- the advance. Queues the job's on_failure hook, unless the tick was itself a hook (no hook of a hook), and
-- sends the event; both commit with the failure's marker, or neither does. A tick whose hook is still owed
-- and that fails again owes no second hook (one request per job and planned time).
CREATE OR REPLACE FUNCTION radix._failed_for_good(s radix.radix_system_job_state, error jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    j radix.jobs;
BEGIN
    IF s.request_kind IS DISTINCT FROM 'on_failure' THEN
        SELECT * INTO j FROM radix.jobs x WHERE x.job_id = s.job_id;
        IF j.on_failure_oid IS NOT NULL THEN
            INSERT INTO radix.job_requests (job_id, planned_ns, kind, requested_by, detail)
            VALUES (s.job_id, s.planned_ns, 'on_failure', j.owner_name, radix._failure_document(j, s, error))
            ON CONFLICT DO NOTHING;
        END IF;
    END IF;
    PERFORM radix._event(s.job_id, 'failed', coalesce(s.request_kind, 'schedule'), error->>'category', s.attempt,
                         s.planned_ns);
END $$;
