-- 0006: memory bounds on what a tenant can store for the daemon to hold, and canonical argument text
-- from PostgreSQL's own output functions.
--
-- A job's stored arguments are at most radix.max_argument_bytes() bytes of canonical text in total; a
-- document's props at most radix.max_document_bytes() bytes of JSON text. Both are refused at admission
-- with one line naming the size and the limit (SQLSTATE 54000), nothing written. The engine runs a CALL
-- inside a DO block (engine/definitions.py), so a procedure's OUT/INOUT results stay on the server: every
-- output parameter of a job's procedure must therefore be given an argument (a variable in that block),
-- and the principal needs USAGE on plpgsql (granted to PUBLIC by default).

-- The limits, as constants: an administrator may CREATE OR REPLACE these (superuser), and admission reads
-- them at every call. 64 KiB is far above what parameters of a scheduled call need (ids, batch sizes,
-- dates, small JSON settings: bulk data belongs in tables), and keeps a definition small enough that the
-- engine caches thousands of them in a few megabytes.
CREATE FUNCTION radix.max_argument_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 65536;

CREATE FUNCTION radix.max_document_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 65536;

COMMENT ON FUNCTION radix.max_argument_bytes() IS
    'radixjobs: the most bytes of canonical argument text one job may store (all arguments together)';
COMMENT ON FUNCTION radix.max_document_bytes() IS
    'radixjobs: the most bytes a CRON_TABLE document''s props may take as JSON text';

-- Raise unless the bound arguments (radix._bind_arguments' "arguments") fit radix.max_argument_bytes().
CREATE FUNCTION radix._check_argument_size(arguments jsonb) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    total bigint := (SELECT coalesce(sum(octet_length(a->>'value')), 0)
                     FROM jsonb_array_elements(arguments) AS x(a));
BEGIN
    IF total > radix.max_argument_bytes() THEN
        RAISE EXCEPTION 'job arguments are % bytes; the limit is %', total, radix.max_argument_bytes()
            USING ERRCODE = '54000',
                  HINT = 'Pass a key to data kept in a table instead of the data itself.';
    END IF;
END $$;

-- Raise unless every output parameter (OUT, INOUT) of `proc` has an argument in `arguments`: the engine
-- hands each a variable of its DO block, and PL/pgSQL cannot CALL with an omitted INOUT parameter.
CREATE FUNCTION radix._check_output_arguments(proc oid, arguments jsonb) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    missing text := (
        SELECT string_agg(coalesce(quote_ident(nullif(p.argname, '')), 'parameter ' || p.ord), ', ' ORDER BY p.ord)
        FROM radix._procedure_parameters(proc) p
        WHERE p.mode IN ('o', 'b')
          AND p.ord NOT IN (SELECT (a->>'position')::integer FROM jsonb_array_elements(arguments) AS x(a)));
BEGIN
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'a job must pass an argument for each INOUT parameter of %: % has none', proc::regprocedure,
            missing USING ERRCODE = '0A000',
            HINT = 'Write the default out, e.g. name => NULL; the job discards what the procedure returns.';
    END IF;
END $$;

-- A value's text in one fixed format, whatever the session prints with: ISO dates, postgres-style
-- intervals, shortest exact floats, time stamps in UTC, hex bytea. The argument was read with the
-- caller's settings, as CALL reads it; only the printing is fixed, so the engine's session, with its
-- own settings, reads back the same value. The text comes from the type's output function (format's %s),
-- never from a cast to text: the owner of a type may CREATE CAST (type AS text) with any function, and
-- the engine reads the value back with the type's input function. NULL stays NULL (num_nulls: a row
-- whose fields are all NULL is a value, not NULL).
CREATE OR REPLACE FUNCTION radix._canonical_text(v anyelement) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET DateStyle = 'ISO, YMD'
SET IntervalStyle = 'postgres'
SET extra_float_digits = 1
SET TimeZone = 'UTC'
SET bytea_output = 'hex'
AS $$
BEGIN
    IF pg_catalog.num_nulls(v) = 1 THEN
        RETURN NULL;
    END IF;
    RETURN pg_catalog.format('%s', v);
END $$;

-- Bind the given constants to the parameters of the chosen overload and convert each to the declared
-- type (checked conversion, as the CALL at run time will do). Returns the definition's arguments.
-- Positional arguments from a VARIADIC parameter's position on are its elements, one argument each
-- (stored with the element type and the parameter's position, as CALL p(1, 2, 3) passes them).
-- The stored text is bounded (radix._check_argument_size) and every output parameter has an argument
-- (radix._check_output_arguments).
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
    PERFORM radix._check_argument_size(bound);
    PERFORM radix._check_output_arguments(proc, bound);
    RETURN jsonb_build_object('procedure_oid', proc, 'signature', proc::regprocedure::text,
                              'arguments', bound);
END $$;

-- The definer side's check of a binding made by radix._resolve_call on the caller's side: the
-- procedure is proc_schema.proc_name, every argument names one of its parameters with that parameter's
-- type (any real type for polymorphic and VARIADIC ones), values are text or NULL, their total fits
-- radix.max_argument_bytes() and every output parameter has one. Type names and parameter names are
-- taken from the catalog, never from the binding.
CREATE OR REPLACE FUNCTION radix._check_binding(proc_schema text, proc_name text, binding jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    proc oid;
    a jsonb;
    param record;
    typ oid;
    valid boolean;
    checked jsonb := '[]';
BEGIN
    IF jsonb_typeof(binding) = 'object' AND jsonb_typeof(binding->'arguments') = 'array'
       AND jsonb_typeof(binding->'procedure_oid') IN ('number', 'string') THEN
        SELECT p.oid INTO proc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE p.oid = (binding->>'procedure_oid')::oid AND p.prokind = 'p'
          AND n.nspname = proc_schema AND p.proname = proc_name;
    END IF;
    IF proc IS NULL THEN
        RAISE EXCEPTION 'invalid argument binding for procedure %.%', quote_ident(proc_schema),
            quote_ident(proc_name) USING ERRCODE = '22023';
    END IF;
    PERFORM radix._check_argument_size(binding->'arguments');
    FOR a IN SELECT e FROM jsonb_array_elements(binding->'arguments') AS x(e) LOOP
        valid := false;
        IF jsonb_typeof(a->'position') = 'number' AND jsonb_typeof(a->'type_oid') IN ('number', 'string')
           AND coalesce(jsonb_typeof(a->'value'), 'null') IN ('string', 'null') THEN
            SELECT * INTO param FROM radix._procedure_parameters(proc) WHERE ord = (a->>'position')::numeric;
            IF FOUND THEN
                SELECT t.oid INTO typ FROM pg_type t
                WHERE t.oid = (a->>'type_oid')::oid AND t.typtype <> 'p'
                  AND (t.oid = param.argtype OR param.mode = 'v'
                       OR (SELECT typtype = 'p' FROM pg_type WHERE oid = param.argtype));
                valid := FOUND;
            END IF;
        END IF;
        IF NOT valid THEN
            RAISE EXCEPTION 'invalid argument binding for procedure %.%', quote_ident(proc_schema),
                quote_ident(proc_name) USING ERRCODE = '22023';
        END IF;
        checked := checked || jsonb_build_object(
            'position', param.ord, 'name', param.argname, 'by_name', coalesce(a->'by_name' = 'true', false),
            'type', format_type(typ, NULL), 'type_oid', typ, 'value', a->>'value');
    END LOOP;
    PERFORM radix._check_output_arguments(proc, checked);
    RETURN jsonb_build_object('procedure_oid', proc, 'signature', proc::regprocedure::text,
                              'arguments', checked);
END $$;

-- CREATE JOB. `creator` is checked by radix._caller, the rest by radix._check_admission again, and
-- `binding` (radix._resolve_call's result, made on the caller's side) by radix._check_binding; see
-- radix.create_job for the public entry point. The engine runs the CALL in a DO block (so that no
-- OUT/INOUT result reaches the daemon): the principal must be able to use PL/pgSQL.
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
            sched->>'cron_time_zone', coalesce(enabled, true), coalesce(deadline_ms, 240000))
    RETURNING * INTO j;
    PERFORM radix._arm_state(j);
    RETURN j.job_id;
END $$;

-- A document's props are bounded too (the scheduler reads them for every run). A trigger of this
-- migration's own, so that the admission functions of 0004 stay as they are: the apply fails as a whole.
CREATE FUNCTION radix._bound_document_props() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    size bigint := octet_length(NEW.props::text);
BEGIN
    IF size > radix.max_document_bytes() THEN
        RAISE EXCEPTION 'document %: props are % bytes; the limit is %', NEW.num, size, radix.max_document_bytes()
            USING ERRCODE = '54000';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER cron_table_props_bound BEFORE INSERT OR UPDATE OF props ON radix.cron_table
    FOR EACH ROW EXECUTE FUNCTION radix._bound_document_props();

REVOKE ALL ON FUNCTION radix._bound_document_props() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION radix.max_argument_bytes(), radix.max_document_bytes(),
    radix._check_argument_size(jsonb), radix._check_output_arguments(oid, jsonb) TO PUBLIC;
