-- Admission: a call resolved, its arguments bound and checked, its schedule and options normalised.

-- Split 'schema.name' (PostgreSQL identifier rules) into its two parts, or raise.
CREATE OR REPLACE FUNCTION radix._split_qualified(qualified text, what text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    parts text[];
BEGIN
    BEGIN
        parts := parse_ident(qualified);
    EXCEPTION WHEN invalid_parameter_value OR syntax_error THEN
        RAISE EXCEPTION 'invalid % name %', what, quote_literal(qualified) USING ERRCODE = '42602';
    END;
    IF cardinality(parts) <> 2 THEN
        RAISE EXCEPTION '% name must be schema-qualified (schema.name): %', what, quote_literal(qualified)
            USING ERRCODE = '42602';
    END IF;
    RETURN parts;
END $$;

-- SQL text of one argument constant, built only with quote_literal and catalog-formatted type names:
-- never from caller-supplied SQL. Used to resolve the overload and convert the value as CALL would.
CREATE OR REPLACE FUNCTION radix._constant_sql(c jsonb) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    kind text := c->>'kind';
    val text := c->>'value';
    typ oid;
    elements text;
BEGIN
    CASE kind
    WHEN 'integer', 'numeric' THEN
        IF val IS NULL OR val !~ '^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$' THEN
            RAISE EXCEPTION 'invalid numeric constant %', quote_literal(coalesce(val, 'NULL'))
                USING ERRCODE = '22P02';
        END IF;
        RETURN CASE WHEN val LIKE '-%' THEN '(' || val || ')' ELSE val END;
    WHEN 'string' THEN
        RETURN quote_literal(coalesce(val, ''));
    WHEN 'boolean' THEN
        IF lower(val) NOT IN ('true', 'false') THEN
            RAISE EXCEPTION 'invalid boolean constant %', quote_literal(coalesce(val, 'NULL'))
                USING ERRCODE = '22P02';
        END IF;
        RETURN lower(val);
    WHEN 'null' THEN
        RETURN 'NULL';
    WHEN 'typed' THEN
        typ := to_regtype(c->>'type');
        IF typ IS NULL THEN
            RAISE EXCEPTION 'type % does not exist', quote_literal(coalesce(c->>'type', ''))
                USING ERRCODE = '42704';
        END IF;
        RETURN format('CAST(%s AS %s)', coalesce(quote_literal(val), 'NULL'), format_type(typ, NULL));
    WHEN 'array' THEN
        SELECT string_agg(radix._constant_sql(e), ', ' ORDER BY n) INTO elements
        FROM jsonb_array_elements(coalesce(c->'elements', '[]')) WITH ORDINALITY AS x(e, n);
        IF c->>'type' IS NOT NULL THEN  -- ARRAY[...]::type[]: the cast decides the overload, as in CALL
            typ := to_regtype(c->>'type');
            IF typ IS NULL THEN
                RAISE EXCEPTION 'type % does not exist', quote_literal(c->>'type') USING ERRCODE = '42704';
            END IF;
            RETURN format('CAST(ARRAY[%s] AS %s)', coalesce(elements, ''), format_type(typ, NULL));
        END IF;
        IF elements IS NULL THEN
            RAISE EXCEPTION 'an empty ARRAY[] needs a type: write ARRAY[]::type[]' USING ERRCODE = '42P18';
        END IF;
        RETURN 'ARRAY[' || elements || ']';
    ELSE
        RAISE EXCEPTION 'unknown constant kind %', quote_literal(coalesce(kind, 'NULL'))
            USING ERRCODE = '22023';
    END CASE;
END $$;

-- Arguments as given: a JSON array of {name?, kind, value, type?, elements?} (what the DDL parser
-- produces), or, for SQL users, an object {"param": json value, ...} of named arguments.
CREATE OR REPLACE FUNCTION radix._normalise_arguments(args jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN CASE jsonb_typeof(coalesce(args, '[]'))
    WHEN 'array' THEN coalesce(args, '[]')
    WHEN 'object' THEN (
        SELECT coalesce(jsonb_agg(jsonb_build_object(
            'name', key,
            'kind', CASE jsonb_typeof(value)
                        WHEN 'number' THEN CASE WHEN value::text ~ '^-?[0-9]+$' THEN 'integer' ELSE 'numeric' END
                        WHEN 'string' THEN 'string'
                        WHEN 'boolean' THEN 'boolean'
                        WHEN 'null' THEN 'null'
                        ELSE 'string' END,
            'value', CASE jsonb_typeof(value) WHEN 'string' THEN value #>> '{}'
                        WHEN 'null' THEN NULL ELSE value::text END)), '[]')
        FROM jsonb_each(args))
    ELSE NULL END;

-- Clone every routine named proc_schema.proc_name (procedures and functions alike: CALL considers them
-- all, then refuses a function) as a pg_temp function with the parameter list CALL matches against
-- (OUT parameters become inputs, as CALL takes arguments for them; defaults kept as DEFAULT NULL),
-- returning the routine's OID. The probes are made by the catalog's owner, so a creator needs no TEMP
-- privilege; their bodies only return a constant, and the caller rolls them back. Their name is random,
-- so that no function the session created itself can be picked instead.
CREATE OR REPLACE FUNCTION radix._create_probes(proc_schema text, proc_name text) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    probe text := 'radix_call_probe_' || md5(gen_random_uuid()::text);
    cand record;
BEGIN
    FOR cand IN
        SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = proc_schema AND p.proname = proc_name
    LOOP
        EXECUTE format('CREATE FUNCTION pg_temp.%I(%s) RETURNS oid LANGUAGE sql AS %L',
                       probe, radix._probe_parameters(cand.oid), format('SELECT %s::oid', cand.oid));
    END LOOP;
    RETURN probe;
END $$;

-- Resolve schema.proc(args) exactly as CALL would, and convert every given constant to its parameter's
-- declared type now. PostgreSQL's own resolution picks among the probes (radix._create_probes), or
-- raises 42725/42883. SECURITY INVOKER, and called from the invoker entry point: the conversions may
-- run the caller's code (casts, domain checks), which must run with the caller's rights.
CREATE OR REPLACE FUNCTION radix._resolve_call(proc_schema text, proc_name text, args jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    call_args text;
    probe text;
    chosen oid;
    result jsonb;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = proc_schema) THEN
        RAISE EXCEPTION 'schema % does not exist', quote_ident(proc_schema) USING ERRCODE = '3F000';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                   WHERE n.nspname = proc_schema AND p.proname = proc_name AND p.prokind = 'p') THEN
        IF EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                   WHERE n.nspname = proc_schema AND p.proname = proc_name) THEN
            RAISE EXCEPTION '%.% is not a procedure', quote_ident(proc_schema), quote_ident(proc_name)
                USING ERRCODE = '42809', HINT = 'A job CALLs a procedure (CREATE PROCEDURE), not a function.';
        END IF;
        RAISE EXCEPTION 'procedure %.% does not exist', quote_ident(proc_schema), quote_ident(proc_name)
            USING ERRCODE = '42883';
    END IF;

    SELECT string_agg(CASE WHEN a->>'name' IS NULL THEN radix._constant_sql(a)
                           ELSE quote_ident(a->>'name') || ' => ' || radix._constant_sql(a) END,
                      ', ' ORDER BY n)
      INTO call_args FROM jsonb_array_elements(args) WITH ORDINALITY AS x(a, n);

    BEGIN
        probe := radix._create_probes(proc_schema, proc_name);
        EXECUTE format('SELECT pg_temp.%I(%s)', probe, coalesce(call_args, '')) INTO chosen;
        IF (SELECT prokind FROM pg_proc WHERE oid = chosen) <> 'p' THEN
            RAISE EXCEPTION '% is not a procedure', chosen::regprocedure USING ERRCODE = '42809',
                HINT = 'CALL picks this function for these arguments; a job CALLs a procedure.';
        END IF;
        result := radix._bind_arguments(chosen, args);
        -- undo the probes (and anything else) by failing this block on purpose
        RAISE EXCEPTION USING ERRCODE = 'RXOK0', MESSAGE = result::text;
    EXCEPTION
        WHEN SQLSTATE 'RXOK0' THEN
            RETURN SQLERRM::jsonb;
        WHEN data_exception THEN
            RAISE EXCEPTION 'invalid argument for %.%: %', quote_ident(proc_schema), quote_ident(proc_name),
                SQLERRM USING ERRCODE = SQLSTATE;
        WHEN duplicate_function THEN
            RAISE EXCEPTION 'procedure %.% is not unique', quote_ident(proc_schema), quote_ident(proc_name)
                USING ERRCODE = '42725';
        WHEN undefined_function THEN
            RAISE EXCEPTION 'procedure %.%(%) does not exist', quote_ident(proc_schema),
                quote_ident(proc_name), coalesce(call_args, '')
                USING ERRCODE = '42883',
                      HINT = 'No overload matches the given argument names and types (OUT parameters need an argument, usually NULL).';
        WHEN ambiguous_function THEN
            RAISE EXCEPTION 'procedure %.%(%) is not unique', quote_ident(proc_schema),
                quote_ident(proc_name), coalesce(call_args, '')
                USING ERRCODE = '42725', HINT = 'Add explicit casts to the arguments to pick one overload.';
    END;
END $$;

-- One row per argument CALL takes (IN, INOUT, OUT, VARIADIC), with whether it has a default.
CREATE OR REPLACE FUNCTION radix._procedure_parameters(proc oid)
RETURNS TABLE (ord integer, argname text, argtype oid, mode "char", has_default boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
    WITH a AS (
        SELECT x.ord::integer AS ord, x.t AS argtype,
               coalesce(p.proargmodes[x.ord], 'i') AS mode,
               p.proargnames[x.ord] AS argname,
               p.pronargdefaults AS ndefaults
        FROM pg_proc p,
             unnest(coalesce(p.proallargtypes, p.proargtypes::oid[])) WITH ORDINALITY AS x(t, ord)
        WHERE p.oid = proc
    ), inputs AS (
        SELECT a.*, count(*) FILTER (WHERE mode IN ('i', 'b', 'v')) OVER (ORDER BY ord DESC) AS from_end
        FROM a
    )
    SELECT ord, argname, argtype, mode,
           mode IN ('i', 'b', 'v') AND from_end <= ndefaults
    FROM inputs WHERE mode <> 't' ORDER BY ord
$$;

-- The parameter list of a clone of procedure `proc`: every argument CALL takes, in order.
CREATE OR REPLACE FUNCTION radix._probe_parameters(proc oid) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN (
    SELECT coalesce(string_agg(
        CASE WHEN mode = 'v' THEN 'VARIADIC ' ELSE '' END
        || CASE WHEN nullif(argname, '') IS NOT NULL THEN quote_ident(argname) || ' ' ELSE '' END
        || format_type(argtype, NULL)
        || CASE WHEN has_default THEN ' DEFAULT NULL' ELSE '' END, ', ' ORDER BY ord), '')
    FROM radix._procedure_parameters(proc));

-- The admission checks alone, for the entry point to run before it resolves the CALL.
CREATE OR REPLACE FUNCTION radix._admit(creator name, job text, run_as text, if_not_exists boolean) RETURNS uuid
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN radix._check_admission(radix._caller(creator), radix._split_qualified(job, 'job'), run_as,
                              if_not_exists);

-- Raise unless the bound arguments (radix._bind_arguments' "arguments") fit radix.max_argument_bytes().
CREATE OR REPLACE FUNCTION radix._check_argument_size(arguments jsonb) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
CREATE OR REPLACE FUNCTION radix._check_output_arguments(proc oid, arguments jsonb) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

-- The definer side's check of a binding made by radix._resolve_call on the caller's side: the
-- procedure is proc_schema.proc_name, every argument names one of its parameters with that parameter's
-- type (any real type for polymorphic and VARIADIC ones), values are text or NULL, their total fits
-- radix.max_argument_bytes() and every output parameter has one. Type names and parameter names are
-- taken from the catalog, never from the binding.
CREATE OR REPLACE FUNCTION radix._check_binding(proc_schema text, proc_name text, binding jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

-- Raise unless `ms` is a valid timeout; `shown` is how the caller wrote it.
CREATE OR REPLACE FUNCTION radix._check_timeout(ms numeric, shown text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

-- The schedule as stored: EVERY (an interval of one second or more, with an optional STARTING AT), AT,
-- CRON with its time zone, or AFTER its upstream jobs (dependencies.sql); anything else is refused.
CREATE OR REPLACE FUNCTION radix._normalise_schedule(s jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
SET jit = off
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
    ELSIF s ? 'after' THEN
        out := jsonb_build_object('kind', 'after', 'after', radix._normalise_after(s->'after'));
    ELSE
        RAISE EXCEPTION 'schedule must have one of every, at, cron or after' USING ERRCODE = '22023';
    END IF;
    RETURN out;
EXCEPTION
    WHEN invalid_datetime_format OR datetime_field_overflow OR invalid_text_representation
         OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'invalid schedule: %', SQLERRM USING ERRCODE = SQLSTATE;
END $$;

-- The job's arguments bound to the procedure's parameters: each given constant converted to its parameter's
-- type and checked (radix._check_binding), then every input parameter with a default that was not given is bound to its default's
-- value, evaluated now (the creator's rights, this function's search_path, which also deparses it) and
-- converted to the parameter's type like a given constant. It is passed by position when every earlier
-- parameter is, else by name; an unnamed parameter that can be neither is refused. VARIADIC and
-- polymorphic parameters keep their run-time default.
CREATE OR REPLACE FUNCTION radix._bind_arguments(proc oid, args jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

-- The job options' names, as errors list them.
CREATE OR REPLACE FUNCTION radix._option_names() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'timeout, max_attempts, history, coalesce, batch, start_deadline, jitter, group, time_zone, on_failure';

-- Option `k` given as a positive interval string (start_deadline, jitter), in nanoseconds; raises naming the
-- option for anything else (a number, a calendar unit, less than a millisecond).
CREATE OR REPLACE FUNCTION radix._option_interval_ns(k text, v jsonb) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    iv interval;
BEGIN
    IF jsonb_typeof(v) <> 'string' THEN
        RAISE EXCEPTION 'option % must be an interval string, e.g. % = ''10 minutes''', k, k USING ERRCODE = '22023';
    END IF;
    BEGIN
        iv := (v #>> '{}')::interval;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow
                   OR invalid_text_representation THEN
        RAISE EXCEPTION 'option %: invalid interval %', k, quote_literal(v #>> '{}') USING ERRCODE = '22023';
    END;
    IF extract(month FROM iv) <> 0 OR extract(year FROM iv) <> 0 THEN
        RAISE EXCEPTION 'calendar units (month, year) are not allowed in option %', k USING ERRCODE = '22023';
    END IF;
    IF iv > interval '36525 days' THEN
        RAISE EXCEPTION 'option % must be at most 100 years (36525 days), not %', k, quote_literal(v #>> '{}')
            USING ERRCODE = '22023';
    END IF;
    IF iv < interval '1 millisecond' THEN
        RAISE EXCEPTION 'option % must be at least 1 millisecond, not %', k, quote_literal(v #>> '{}')
            USING ERRCODE = '22023';
    END IF;
    RETURN (extract(epoch FROM iv) * 1000000000)::bigint;
END $$;

-- WITH (...) / SET (...) options as given (JSON: {"timeout": "2 hours", "max_attempts": 3, "history":
-- 1000, "coalesce": "off", "batch": "on", "start_deadline": "10 minutes", "jitter": "30 seconds",
-- "time_zone": "Europe/Berlin"}) -> their stored form {deadline_ms, max_attempts, history_limit,
-- coalesce_ticks, batch_ticks, start_deadline_ns, jitter_ns, time_zone}, and "group": "etl" as given (the job's
-- owner is checked against the group's when the job joins, radix._group_for_job), "on_failure": "app.alert" as
-- given (resolved by radix._resolve_hook, checked by radix._check_hook); raises naming the option for anything
-- else. Runs on the caller's side (an interval is read in the caller's session, like a constant).
CREATE OR REPLACE FUNCTION radix._normalise_options(opts jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    k text;
    v jsonb;
    t text;
    out jsonb := '{}';
    iv interval;
    n numeric;
    top integer;
BEGIN
    IF opts IS NULL THEN
        RETURN out;
    END IF;
    IF jsonb_typeof(opts) <> 'object' THEN
        RAISE EXCEPTION 'options must be a JSON object' USING ERRCODE = '22023';
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(opts) LOOP
        t := CASE jsonb_typeof(v) WHEN 'string' THEN v #>> '{}' WHEN 'number' THEN v::text
                                  WHEN 'boolean' THEN v::text END;
        IF t IS NULL THEN
            RAISE EXCEPTION 'option % needs a value', k USING ERRCODE = '22023';
        END IF;
        CASE k
        WHEN 'timeout' THEN
            BEGIN
                iv := CASE WHEN jsonb_typeof(v) = 'number' THEN make_interval(secs => t::float8 / 1000)
                           ELSE t::interval END;
            EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow
                           OR invalid_text_representation THEN
                RAISE EXCEPTION 'option timeout: invalid interval %', quote_literal(t) USING ERRCODE = '22023';
            END;
            IF extract(month FROM iv) <> 0 OR extract(year FROM iv) <> 0 THEN
                RAISE EXCEPTION 'calendar units (month, year) are not allowed in a timeout' USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object('deadline_ms',
                radix._check_timeout(extract(epoch FROM iv) * 1000, quote_literal(t)));
        WHEN 'max_attempts', 'history' THEN
            BEGIN
                n := t::numeric;
            EXCEPTION WHEN invalid_text_representation THEN
                n := NULL;
            END;
            top := CASE k WHEN 'history' THEN 100000 ELSE 10 END;  -- (a CASE in an IF would end at THEN)
            IF n IS NULL OR n <> trunc(n) OR n < 1 OR n > top THEN
                RAISE EXCEPTION 'option % must be an integer from 1 to %, not %', k, top, t USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object(CASE k WHEN 'history' THEN 'history_limit' ELSE k END, n::integer);
        WHEN 'coalesce', 'batch' THEN
            IF lower(t) NOT IN ('on', 'off', 'true', 'false', 'yes', 'no', '1', '0') THEN
                RAISE EXCEPTION 'option % must be on or off, not %', k, t USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object(k || '_ticks', lower(t) IN ('on', 'true', 'yes', '1'));
        WHEN 'start_deadline', 'jitter' THEN
            out := out || jsonb_build_object(k || '_ns', radix._option_interval_ns(k, v));
        WHEN 'group' THEN
            IF jsonb_typeof(v) <> 'string' OR t = '' THEN
                RAISE EXCEPTION 'option group must be a job group''s name string, e.g. group = ''etl''' USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object('group', t);
        WHEN 'on_failure' THEN
            IF jsonb_typeof(v) <> 'string' THEN
                RAISE EXCEPTION 'option on_failure must be a procedure''s name string, e.g. on_failure = ''app.alert'''
                    USING ERRCODE = '22023';
            END IF;
            PERFORM radix._split_qualified(t, 'procedure');
            out := out || jsonb_build_object('on_failure', t);
        WHEN 'time_zone' THEN
            IF NOT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = t) THEN
                RAISE EXCEPTION 'option time_zone: unknown time zone %', quote_literal(t) USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object('time_zone', t);
        ELSE
            RAISE EXCEPTION 'unknown option "%" (accepted: %)', k, radix._option_names() USING ERRCODE = '22023';
        END CASE;
    END LOOP;
    RETURN out;
END $$;
