-- 0002: the job catalog, scheduler state and history, and admission (CREATE / ALTER / DROP JOB).
--
-- Admission lives here so that every client passes through it: the CLI and Python API call the same
-- functions a SQL user calls. Catalog tables are written only by SECURITY DEFINER functions; ordinary
-- roles read their own jobs through radix.job_overview.
--
-- Resolving the CALL and converting its constants evaluate expressions, and those may run the creator's
-- own code (domain CHECKs, casts, input functions of the creator's types). So that part runs with the
-- caller's rights, in the SECURITY INVOKER entry point radix.create_job; the definer side re-checks who
-- may act as whom and stores only a binding it has validated against the catalog. A caller that skips
-- the entry point can only store a job that fails when its own principal runs it.

CREATE TABLE radix.jobs (
    job_id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    schema_name        name NOT NULL,
    job_name           name NOT NULL,
    owner_oid          oid NOT NULL,
    owner_name         name NOT NULL,
    principal_oid      oid NOT NULL,
    principal_name     name NOT NULL,
    procedure_oid      oid NOT NULL,
    procedure_signature text NOT NULL,
    arguments          jsonb NOT NULL DEFAULT '[]',
    schedule_kind      text NOT NULL CHECK (schedule_kind IN ('every', 'at', 'cron')),
    interval_ns        bigint CHECK (interval_ns > 0),
    starting_at_ns     bigint,
    at_ns              bigint,
    cron_expression    text,
    cron_time_zone     text,
    enabled            boolean NOT NULL DEFAULT true,
    definition_version bigint NOT NULL DEFAULT 1,
    deadline_ms        integer NOT NULL DEFAULT 240000 CHECK (deadline_ms BETWEEN 1 AND 270000),
    non_atomic         boolean NOT NULL DEFAULT false,
    created_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (schema_name, job_name),
    CHECK ((schedule_kind = 'every') = (interval_ns IS NOT NULL)),
    CHECK ((schedule_kind = 'at') = (at_ns IS NOT NULL)),
    CHECK ((schedule_kind = 'cron') = (cron_expression IS NOT NULL))
);

CREATE TABLE radix.radix_system_job_state (
    job_id             uuid PRIMARY KEY REFERENCES radix.jobs ON DELETE CASCADE,
    definition_version bigint NOT NULL,
    status             text NOT NULL CHECK (status IN
                         ('scheduled', 'running', 'retry_wait', 'complete', 'failed', 'disabled')),
    anchor_ns          bigint NOT NULL,
    planned_ns         bigint,
    attempt            integer NOT NULL DEFAULT 0,
    due_ns             bigint,
    idempotency_key    text,
    lease_node         text,
    lease_token        uuid,
    lease_expires_at   timestamptz,
    coalesced_ticks    bigint NOT NULL DEFAULT 0,
    last_error         jsonb,
    updated_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- The claim query reads only due rows of live statuses: a partial index keeps it off the catalog.
CREATE INDEX radix_system_job_state_due ON radix.radix_system_job_state (due_ns)
    WHERE status IN ('scheduled', 'running', 'retry_wait');

CREATE TABLE radix.radix_system_job_history (
    history_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id             uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    definition_version bigint NOT NULL,
    planned_ns         bigint NOT NULL,
    attempt            integer NOT NULL,
    idempotency_key    text NOT NULL,
    status             text NOT NULL,
    node               text,
    atomic             boolean,
    started_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at        timestamptz,
    error              jsonb,
    UNIQUE (job_id, planned_ns, attempt)
);
CREATE INDEX radix_system_job_history_job ON radix.radix_system_job_history (job_id, history_id);

REVOKE ALL ON radix.jobs, radix.radix_system_job_state, radix.radix_system_job_history FROM PUBLIC;

-- Time helpers: schedule arithmetic is in UTC nanoseconds (bigint).
CREATE FUNCTION radix.to_ns(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (extract(epoch FROM t) * 1000000000)::bigint;

CREATE FUNCTION radix.from_ns(ns bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN to_timestamp(0) + make_interval(secs => ns / 1000000000.0);

GRANT EXECUTE ON FUNCTION radix.to_ns(timestamptz), radix.from_ns(bigint) TO PUBLIC;

-- May `actor` act as `target`? Superusers may; nobody else may act as a superuser; otherwise the
-- actor must be the target or hold the SET option on it (PostgreSQL 16+; MEMBER before that, where
-- membership implied SET).
CREATE FUNCTION radix.may_act_as(actor oid, target oid) RETURNS boolean
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
RETURN (SELECT CASE
          WHEN a.rolsuper THEN true
          WHEN t.rolsuper THEN false
          WHEN actor = target THEN true
          WHEN current_setting('server_version_num')::int >= 160000 THEN pg_has_role(actor, target, 'SET')
          ELSE pg_has_role(actor, target, 'MEMBER')
        END
        FROM pg_roles a, pg_roles t WHERE a.oid = actor AND t.oid = target);

-- The role a request comes from. Public entry points are SECURITY INVOKER wrappers passing
-- current_user; the definer side accepts it only when the session could become that role itself, so
-- naming another role gains nothing the session does not already have.
CREATE FUNCTION radix._caller(claimed name) RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := (SELECT oid FROM pg_roles WHERE rolname = claimed);
    sess oid := (SELECT oid FROM pg_roles WHERE rolname = session_user);
BEGIN
    IF caller IS NULL OR NOT (caller = sess OR radix.may_act_as(sess, caller)) THEN
        RAISE EXCEPTION 'permission denied: this session cannot act as the calling role'
            USING ERRCODE = '42501';
    END IF;
    RETURN caller;
END $$;

-- Split 'schema.name' (PostgreSQL identifier rules) into its two parts, or raise.
CREATE FUNCTION radix._split_qualified(qualified text, what text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
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
CREATE FUNCTION radix._constant_sql(c jsonb) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
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
CREATE FUNCTION radix._normalise_arguments(args jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
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
CREATE FUNCTION radix._create_probes(proc_schema text, proc_name text) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
CREATE FUNCTION radix._resolve_call(proc_schema text, proc_name text, args jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
CREATE FUNCTION radix._procedure_parameters(proc oid)
RETURNS TABLE (ord integer, argname text, argtype oid, mode "char", has_default boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
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
CREATE FUNCTION radix._probe_parameters(proc oid) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN (
    SELECT coalesce(string_agg(
        CASE WHEN mode = 'v' THEN 'VARIADIC ' ELSE '' END
        || CASE WHEN nullif(argname, '') IS NOT NULL THEN quote_ident(argname) || ' ' ELSE '' END
        || format_type(argtype, NULL)
        || CASE WHEN has_default THEN ' DEFAULT NULL' ELSE '' END, ', ' ORDER BY ord), '')
    FROM radix._procedure_parameters(proc));

-- A value's text in one fixed format, whatever the session prints with: ISO dates, postgres-style
-- intervals, shortest exact floats, time stamps in UTC, hex bytea. The argument was read with the
-- caller's settings, as CALL reads it; only the printing is fixed, so the engine's session, with its
-- own settings, reads back the same value.
CREATE FUNCTION radix._canonical_text(v anyelement) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET DateStyle = 'ISO, YMD'
SET IntervalStyle = 'postgres'
SET extra_float_digits = 1
SET TimeZone = 'UTC'
SET bytea_output = 'hex'
AS $$
BEGIN
    RETURN v::text;
END $$;

-- Bind the given constants to the parameters of the chosen overload and convert each to the declared
-- type (checked conversion, as the CALL at run time will do). Returns the definition's arguments.
-- Positional arguments from a VARIADIC parameter's position on are its elements, one argument each
-- (stored with the element type and the parameter's position, as CALL p(1, 2, 3) passes them).
CREATE FUNCTION radix._bind_arguments(proc oid, args jsonb) RETURNS jsonb
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
    RETURN jsonb_build_object('procedure_oid', proc, 'signature', proc::regprocedure::text,
                              'arguments', bound);
END $$;

-- The definer side's check of a binding made by radix._resolve_call on the caller's side: the
-- procedure is proc_schema.proc_name, every argument names one of its parameters with that parameter's
-- type (any real type for polymorphic and VARIADIC ones), and values are text or NULL. Type names and
-- parameter names are taken from the catalog, never from the binding.
CREATE FUNCTION radix._check_binding(proc_schema text, proc_name text, binding jsonb) RETURNS jsonb
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
    RETURN jsonb_build_object('procedure_oid', proc, 'signature', proc::regprocedure::text,
                              'arguments', checked);
END $$;

-- Validate a schedule given as JSON and return it normalised to nanoseconds:
--   {"every_ns": N | "every": '<interval>', "starting_at_ns": N | "starting_at": '<timestamp>'}
--   {"at_ns": N | "at": '<timestamp>'}
--   {"cron": '<expression>', "time_zone": '<IANA zone>'}
-- Text forms use PostgreSQL's input functions with TimeZone = UTC (a timestamp without offset is UTC).
CREATE FUNCTION radix._normalise_schedule(s jsonb) RETURNS jsonb
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

-- (Re)arm a job's scheduler state at the database clock: new anchor, first planned tick, attempt
-- counter cleared, lease dropped. Cron ticks are planned by the engine (planned_ns NULL until then).
CREATE FUNCTION radix._arm_state(j radix.jobs) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    anchor bigint := coalesce(j.starting_at_ns, now_ns);
    planned bigint;
BEGIN
    IF j.schedule_kind = 'every' THEN
        -- first grid point anchor + k*interval (k >= 1) after both the anchor and now
        planned := anchor + j.interval_ns * greatest(1, (greatest(now_ns - anchor, 0) / j.interval_ns) + 1);
    ELSIF j.schedule_kind = 'at' THEN
        planned := j.at_ns;  -- already past: due at once
    END IF;
    -- a plain UPDATE (NO KEY UPDATE lock) does not wait for a running attempt's KEY SHARE lock;
    -- that attempt then finds its lease gone and rolls back
    UPDATE radix.radix_system_job_state SET
        definition_version = j.definition_version,
        status = CASE WHEN j.enabled THEN 'scheduled' ELSE 'disabled' END,
        anchor_ns = anchor, planned_ns = planned,
        due_ns = CASE WHEN j.enabled THEN coalesce(planned, now_ns) END,
        attempt = 0, idempotency_key = NULL, lease_node = NULL, lease_token = NULL,
        lease_expires_at = NULL, last_error = NULL, updated_at = clock_timestamp()
    WHERE job_id = j.job_id;
    IF NOT FOUND THEN
        INSERT INTO radix.radix_system_job_state
            (job_id, definition_version, status, anchor_ns, planned_ns, due_ns, attempt)
        VALUES (j.job_id, j.definition_version, CASE WHEN j.enabled THEN 'scheduled' ELSE 'disabled' END,
                anchor, planned, CASE WHEN j.enabled THEN coalesce(planned, now_ns) END, 0);
    END IF;
    PERFORM pg_notify('radix_jobs', j.job_id::text);
END $$;

-- Find a job by qualified name, locking it; NULL when it does not exist.
CREATE FUNCTION radix._find_job(qualified text) RETURNS radix.jobs
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    parts text[] := radix._split_qualified(qualified, 'job');
    j radix.jobs;
BEGIN
    -- NO KEY UPDATE: does not wait for the KEY SHARE lock a running attempt's frame holds (its FK)
    SELECT * INTO j FROM radix.jobs WHERE schema_name = parts[1] AND job_name = parts[2] FOR NO KEY UPDATE;
    RETURN j;
END $$;

CREATE FUNCTION radix._check_job_owner(j radix.jobs, caller oid) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT (pg_has_role(caller, j.owner_oid, 'MEMBER')
            OR (SELECT rolsuper FROM pg_roles WHERE oid = caller)) THEN
        RAISE EXCEPTION 'must be owner of job %.%', quote_ident(j.schema_name), quote_ident(j.job_name)
            USING ERRCODE = '42501';
    END IF;
END $$;

-- What CREATE JOB checks before it looks at the CALL: the job's schema exists and the caller may create
-- in it, the name is free, the principal exists, the caller may act as it, and it can log in. Returns
-- the existing job's id when IF NOT EXISTS finds one (NULL otherwise); raises on any failure.
CREATE FUNCTION radix._check_admission(caller oid, job_parts text[], run_as text, if_not_exists boolean)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_schema oid := (SELECT oid FROM pg_namespace WHERE nspname = job_parts[1]);
    principal pg_roles;
    existing uuid;
BEGIN
    IF job_schema IS NULL THEN
        RAISE EXCEPTION 'schema % does not exist', quote_ident(job_parts[1]) USING ERRCODE = '3F000';
    END IF;
    IF NOT has_schema_privilege(caller, job_schema, 'CREATE') THEN
        RAISE EXCEPTION 'permission denied for schema %', quote_ident(job_parts[1]) USING ERRCODE = '42501',
            HINT = 'Creating a job needs the CREATE privilege on its schema.';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('radix.job:' || job_parts[1] || '.' || job_parts[2]));
    SELECT job_id INTO existing FROM radix.jobs WHERE schema_name = job_parts[1] AND job_name = job_parts[2];
    IF FOUND THEN
        IF if_not_exists THEN
            RAISE NOTICE 'job %.% already exists, skipping', quote_ident(job_parts[1]), quote_ident(job_parts[2]);
            RETURN existing;
        END IF;
        RAISE EXCEPTION 'job %.% already exists', quote_ident(job_parts[1]), quote_ident(job_parts[2])
            USING ERRCODE = '42710';
    END IF;

    SELECT * INTO principal FROM pg_roles WHERE rolname = run_as;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role % does not exist', quote_ident(run_as) USING ERRCODE = '42704';
    END IF;
    IF NOT radix.may_act_as(caller, principal.oid) THEN
        IF principal.rolsuper THEN
            RAISE EXCEPTION 'permission denied to schedule a job as superuser %', quote_ident(run_as)
                USING ERRCODE = '42501', HINT = 'Only superusers may name a superuser principal.';
        END IF;
        RAISE EXCEPTION 'permission denied to schedule a job as role %', quote_ident(run_as)
            USING ERRCODE = '42501',
                  HINT = 'The creator must be able to SET ROLE to the principal (GRANT ... WITH SET TRUE).';
    END IF;
    IF NOT principal.rolcanlogin THEN
        RAISE EXCEPTION 'role % cannot log in', quote_ident(run_as) USING ERRCODE = '42501',
            HINT = format('Jobs run on a connection logged in as their principal: ALTER ROLE %s LOGIN.',
                          quote_ident(run_as));
    END IF;
    RETURN NULL;
END $$;

-- The admission checks alone, for the entry point to run before it resolves the CALL.
CREATE FUNCTION radix._admit(creator name, job text, run_as text, if_not_exists boolean) RETURNS uuid
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN radix._check_admission(radix._caller(creator), radix._split_qualified(job, 'job'), run_as,
                              if_not_exists);

-- CREATE JOB. `creator` is checked by radix._caller, the rest by radix._check_admission again, and
-- `binding` (radix._resolve_call's result, made on the caller's side) by radix._check_binding; see
-- radix.create_job for the public entry point.
CREATE FUNCTION radix._create_job(creator name, job text, schedule jsonb, run_as text, procedure text,
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

-- ALTER JOB ... ENABLE | DISABLE: a change of state bumps definition_version and re-arms the state
-- (an attempt still running under the old version cannot finalise: its lease token is gone).
-- Returns true when the state changed.
CREATE FUNCTION radix._alter_job(creator name, job text, enabled boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    j radix.jobs := radix._find_job(job);
BEGIN
    IF j.job_id IS NULL THEN
        RAISE EXCEPTION 'job % does not exist', job USING ERRCODE = '42704';
    END IF;
    PERFORM radix._check_job_owner(j, caller);
    IF j.enabled = enabled THEN
        RETURN false;
    END IF;
    UPDATE radix.jobs SET enabled = _alter_job.enabled, definition_version = definition_version + 1
    WHERE job_id = j.job_id RETURNING * INTO j;
    PERFORM radix._arm_state(j);
    RETURN true;
END $$;

-- DROP JOB [IF EXISTS] ... [RESTRICT | CASCADE]. Dependents are rows of tables outside schema radix
-- that reference radix.jobs by foreign key. RESTRICT refuses while an attempt holds a live claim or
-- dependents exist; CASCADE deletes the dependents and drops the job even if an attempt is running:
-- that attempt can no longer finalise. The job's own rows in radix (state, history, attempt frames,
-- idempotency keys) go with it. Dependents are handled by radix.drop_job with the caller's own rights
-- (privileges, row-level security, triggers), never with the definer's.
-- The tables with rows referencing a job by foreign key (other than radix's own), for its owner.
-- Existence is read with the definer's rights, as PostgreSQL's own RESTRICT reports dependents the
-- caller cannot read; deleting them (CASCADE) is left to radix.drop_job, with the caller's rights.
CREATE FUNCTION radix._job_dependents(creator name, job text)
RETURNS TABLE (tbl regclass, col name, job_id uuid)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    parts text[] := radix._split_qualified(job, 'job');
    j radix.jobs;
    dep record;
    found_dependent boolean;
BEGIN
    SELECT * INTO j FROM radix.jobs WHERE schema_name = parts[1] AND job_name = parts[2];
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM radix._check_job_owner(j, caller);
    FOR dep IN
        SELECT c.conrelid::regclass AS t, a.attname AS c
        FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
        WHERE c.contype = 'f' AND c.confrelid = 'radix.jobs'::regclass AND cardinality(c.conkey) = 1
          AND c.connamespace <> 'radix'::regnamespace  -- the job's own rows: state, history, frames, keys
    LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE %I = $1)', dep.t, dep.c)
            INTO found_dependent USING j.job_id;
        IF found_dependent THEN
            tbl := dep.t; col := dep.c; job_id := j.job_id;
            RETURN NEXT;
        END IF;
    END LOOP;
END $$;

CREATE FUNCTION radix._drop_job(creator name, job text, if_exists boolean, cascade boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    j radix.jobs := radix._find_job(job);
BEGIN
    IF j.job_id IS NULL THEN
        IF if_exists THEN
            RAISE NOTICE 'job % does not exist, skipping', job;
            RETURN false;
        END IF;
        RAISE EXCEPTION 'job % does not exist', job USING ERRCODE = '42704';
    END IF;
    PERFORM radix._check_job_owner(j, caller);
    IF NOT cascade AND EXISTS (SELECT 1 FROM radix.radix_system_job_state
                               WHERE job_id = j.job_id AND lease_expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION 'cannot drop job %.%: an attempt is running', quote_ident(j.schema_name),
            quote_ident(j.job_name) USING ERRCODE = '55006',
            HINT = 'Wait for it to finish, or use DROP JOB ... CASCADE.';
    END IF;
    DELETE FROM radix.jobs WHERE job_id = j.job_id;
    PERFORM pg_notify('radix_jobs', j.job_id::text);
    RETURN true;
END $$;

-- Public entry points (SECURITY INVOKER): the calling role is current_user at the call site.
-- create_job checks admission first, then resolves the CALL with the caller's rights (see the top of
-- this file), then hands the binding to the definer side, which checks everything again.
CREATE FUNCTION radix.create_job(job text, schedule jsonb, run_as text, procedure text,
                                 arguments jsonb DEFAULT '[]', enabled boolean DEFAULT true,
                                 if_not_exists boolean DEFAULT false, deadline_ms integer DEFAULT 240000)
RETURNS uuid LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    args jsonb := radix._normalise_arguments(arguments);
    proc_parts text[] := radix._split_qualified(procedure, 'procedure');
    existing uuid;
BEGIN
    IF args IS NULL THEN
        RAISE EXCEPTION 'arguments must be a JSON array or object' USING ERRCODE = '22023';
    END IF;
    existing := radix._admit(current_user, job, run_as, if_not_exists);
    IF existing IS NOT NULL THEN
        RETURN existing;
    END IF;
    RETURN radix._create_job(current_user, job, schedule, run_as, procedure,
                             radix._resolve_call(proc_parts[1], proc_parts[2], args), enabled,
                             if_not_exists, deadline_ms);
END $$;

CREATE FUNCTION radix.alter_job(job text, enabled boolean) RETURNS boolean LANGUAGE sql VOLATILE
RETURN radix._alter_job(current_user, job, enabled);

CREATE FUNCTION radix.drop_job(job text, if_exists boolean DEFAULT false, cascade boolean DEFAULT false)
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    dep record;
BEGIN
    FOR dep IN SELECT * FROM radix._job_dependents(current_user, job) LOOP
        IF NOT cascade THEN
            RAISE EXCEPTION 'cannot drop job % because other objects depend on it', job USING ERRCODE = '2BP01',
                DETAIL = format('rows of %s reference it', dep.tbl),
                HINT = 'Use DROP JOB ... CASCADE to drop the dependent objects too.';
        END IF;
        -- with the caller's own rights: its privileges, row-level security and triggers apply
        EXECUTE format('DELETE FROM %s WHERE %I = $1', dep.tbl, dep.col) USING dep.job_id;
    END LOOP;
    RETURN radix._drop_job(current_user, job, if_exists, cascade);
END $$;

-- What a role may see of the catalog: the jobs it owns (directly or by membership); all for superusers.
CREATE VIEW radix.job_overview WITH (security_barrier) AS
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
       s.status, s.planned_ns, radix.from_ns(s.planned_ns) AS next_run_at, s.attempt, s.due_ns,
       s.idempotency_key, s.lease_node, s.lease_expires_at, s.coalesced_ticks, s.last_error
FROM radix.jobs j LEFT JOIN radix.radix_system_job_state s USING (job_id)
WHERE pg_has_role(j.owner_oid, 'MEMBER')
   OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);

CREATE VIEW radix.job_history WITH (security_barrier) AS
SELECT h.history_id, h.job_id, quote_ident(j.schema_name) || '.' || quote_ident(j.job_name) AS name,
       h.definition_version, h.planned_ns, radix.from_ns(h.planned_ns) AS planned_at, h.attempt,
       h.idempotency_key, h.status, h.node, h.atomic, h.started_at, h.finished_at,
       h.finished_at - h.started_at AS duration, h.error
FROM radix.radix_system_job_history h JOIN radix.jobs j USING (job_id)
WHERE pg_has_role(j.owner_oid, 'MEMBER')
   OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);

-- Internal helpers that read or write the catalog are for the definer functions only. The resolver
-- and its helpers run with the caller's rights and touch nothing but the caller's own rolled-back probes.
REVOKE ALL ON FUNCTION radix._caller(name), radix._normalise_schedule(jsonb), radix._arm_state(radix.jobs),
    radix._find_job(text), radix._check_job_owner(radix.jobs, oid),
    radix._check_admission(oid, text[], text, boolean), radix._check_binding(text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION radix._split_qualified(text, text), radix._constant_sql(jsonb),
    radix._normalise_arguments(jsonb), radix._create_probes(text, text),
    radix._resolve_call(text, text, jsonb), radix._probe_parameters(oid), radix._procedure_parameters(oid),
    radix._canonical_text(anyelement), radix._bind_arguments(oid, jsonb) TO PUBLIC;
GRANT EXECUTE ON FUNCTION radix._admit(name, text, text, boolean),
    radix._create_job(name, text, jsonb, text, text, jsonb, boolean, boolean, integer),
    radix._alter_job(name, text, boolean), radix._drop_job(name, text, boolean, boolean) TO PUBLIC;
GRANT EXECUTE ON FUNCTION radix.create_job(text, jsonb, text, text, jsonb, boolean, boolean, integer),
    radix.alter_job(text, boolean), radix.drop_job(text, boolean, boolean) TO PUBLIC;
GRANT SELECT ON radix.job_overview, radix.job_history TO PUBLIC;
