-- The radix schema as released at version 17 (sql/migrations/0001-0017 of that release, in order), kept
-- only so tests/integration/test_migrate.py can upgrade a database installed with it. Do not edit.

-- ===== 0001_foundation.sql =====
-- 0001: the radix schema. Objects are created by later migrations; ordinary roles may use what is
-- granted to them explicitly (functions such as radix.current_job_id()), and create nothing here.
COMMENT ON SCHEMA radix IS 'radixjobs: durable, SQL-native job scheduler';
REVOKE ALL ON SCHEMA radix FROM PUBLIC;
GRANT USAGE ON SCHEMA radix TO PUBLIC;

-- ===== 0002_jobs.sql =====
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

-- ===== 0003_engine.sql =====
-- 0003: the engine: nodes, claims, attempt frames, exactly-once marker, fenced finalisation.
--
-- Time and ownership are decided by the database clock. A claim is a conditional update of the state
-- row; the lease lasts 5 minutes and every attempt's deadline is shorter. A node is alive while its
-- control session holds its advisory lock, so a crashed node's claims are resumed within seconds.

CREATE TABLE radix.nodes (
    node_id       text PRIMARY KEY,
    backend_pid   integer,       -- the node's control session: the node is alive while it is
    backend_start timestamptz,
    hostname      text,
    pid         integer,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per attempt in progress, keyed by the principal backend running it. Atomic attempts write
-- it inside their own transaction (visible only to that backend); non-atomic ones commit it first.
CREATE TABLE radix.attempt_frames (
    pid             integer PRIMARY KEY,
    backend_start   timestamptz NOT NULL,
    job_id          uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    attempt         integer NOT NULL,
    planned_ns      bigint NOT NULL,
    idempotency_key text NOT NULL,
    lease_token     uuid NOT NULL
);
CREATE INDEX attempt_frames_job ON radix.attempt_frames (job_id);

-- Keys that non-atomic procedures have already acted on (radix.once()).
CREATE TABLE radix.idempotency_keys (
    idempotency_key text PRIMARY KEY,
    job_id          uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

ALTER TABLE radix.radix_system_job_state ADD COLUMN atomic_hint boolean;
CREATE UNIQUE INDEX radix_system_job_history_running
    ON radix.radix_system_job_history (job_id, planned_ns, attempt) WHERE status = 'running';
-- Running claims by node: finding the claims of dead nodes reads only running rows, whatever the number
-- of jobs (radix_system_job_state_due holds every scheduled row, so it cannot serve this).
CREATE INDEX radix_system_job_state_running ON radix.radix_system_job_state (lease_node)
    WHERE status = 'running';
-- Cron jobs, for the engine's planning pass (it must not read every job to find the few cron ones).
CREATE INDEX jobs_cron ON radix.jobs (job_id) WHERE schedule_kind = 'cron';
ALTER TABLE radix.radix_system_job_history DROP CONSTRAINT radix_system_job_history_job_id_planned_ns_attempt_key;

REVOKE ALL ON radix.nodes, radix.attempt_frames, radix.idempotency_keys FROM PUBLIC;

-- A node is alive while its control session is: the backend recorded at registration still runs (pid and
-- start time both match, so neither a reused pid nor another role's session can stand in for it).
CREATE FUNCTION radix.node_alive(node text) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN EXISTS (
    SELECT 1 FROM radix.nodes n
    WHERE n.node_id = node
      AND EXISTS (SELECT 1 FROM pg_stat_get_activity(n.backend_pid) a WHERE a.backend_start = n.backend_start));

-- A committed frame whose backend still runs (pid and start time both match). The backend is looked
-- up by pid only when a frame exists (pg_stat_activity would build a row for every backend).
-- radix.claim_due inlines the same test.
CREATE FUNCTION radix.job_has_live_frame(job uuid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN EXISTS (
    SELECT 1 FROM radix.attempt_frames f
    WHERE f.job_id = job
      AND EXISTS (SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start));

-- Register the calling session as the control session of `node`. Returns false (and changes nothing)
-- when the node is alive in another session: two processes never share a node id.
CREATE FUNCTION radix.register_node(node text, host text, os_pid integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n radix.nodes;
BEGIN
    -- serialise on the node's own row (no other role can lock it), never on an advisory key
    INSERT INTO radix.nodes (node_id) VALUES (node) ON CONFLICT (node_id) DO NOTHING;
    SELECT * INTO n FROM radix.nodes WHERE node_id = node FOR UPDATE;
    IF n.backend_pid IS DISTINCT FROM pg_backend_pid() AND radix.node_alive(node) THEN
        RETURN false;
    END IF;
    UPDATE radix.nodes SET hostname = host, pid = os_pid, backend_pid = pg_backend_pid(),
        backend_start = (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a),
        last_seen = clock_timestamp()
    WHERE node_id = node;
    RETURN true;
END $$;

-- claim_due: claim up to `max_claims` ticks for `node`. Claimable: the claims of dead nodes (running,
-- their node's control session gone), then due rows in due order (scheduled / retry_wait with due_ns <=
-- now, or running with an expired lease); never a job with a committed frame whose backend still runs,
-- and never a row locked by a running atomic attempt (KEY SHARE) or another claimer (SKIP LOCKED).
-- With `with_cron` false, cron ticks are left alone (the engine plans them first, see planning.py).
-- Missed interval ticks coalesce to the latest due one (counted) when a fresh tick starts; a resumed
-- claim keeps its planned time, attempt number and idempotency key. Each claim writes the state and a
-- 'running' history row together.
-- Cost: index scans over the rows it takes (radix_system_job_state_due stops at max_claims) and over
-- running rows (radix_system_job_state_running); node liveness is looked up only when another node
-- holds a running claim. The catalog is never scanned, so a claim costs the same at 10 or 10^6 jobs.
CREATE FUNCTION radix.claim_due(node text, max_claims integer, with_cron boolean DEFAULT true)
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
    dead text[] := '{}';
    picked uuid[] := '{}';
    resuming boolean;
BEGIN
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
    picked := picked || ARRAY(
        SELECT s.job_id FROM radix.radix_system_job_state s
        WHERE s.status IN ('scheduled', 'retry_wait', 'running') AND s.due_ns <= now_ns
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
        LIMIT max_claims - cardinality(picked)
        FOR UPDATE SKIP LOCKED);
    IF cardinality(picked) = 0 THEN
        RETURN;
    END IF;
    resuming := cardinality(dead) > 0 OR EXISTS (
        SELECT 1 FROM radix.radix_system_job_state s WHERE s.job_id = ANY (picked) AND s.status = 'running');

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
            lease_expires_at = now_ts + interval '5 minutes',
            due_ns = radix.to_ns(now_ts + interval '5 minutes'),
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

-- The tick's outcome on success: the next planned tick, or complete for a one-time job (or a cron
-- schedule with no further tick). Fenced by the lease token: returns false when the lease was lost.
CREATE FUNCTION radix._advance(job uuid, token uuid, next_planned_ns bigint, succeeded boolean,
                               error jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind text := (SELECT schedule_kind FROM radix.jobs WHERE job_id = job);
BEGIN
    UPDATE radix.radix_system_job_state SET
        status = CASE WHEN kind = 'at' OR next_planned_ns IS NULL
                      THEN CASE WHEN succeeded THEN 'complete' ELSE 'failed' END
                      ELSE 'scheduled' END,
        planned_ns = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN planned_ns ELSE next_planned_ns END,
        due_ns = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN NULL ELSE next_planned_ns END,
        attempt = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN attempt ELSE 0 END,
        idempotency_key = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN idempotency_key END,
        lease_node = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = coalesce(error, CASE WHEN succeeded THEN NULL ELSE last_error END),
        updated_at = clock_timestamp()
    WHERE job_id = job AND lease_token = token AND status = 'running';
    RETURN FOUND;
END $$;

-- First statement of every attempt, on the connection logged in as the principal. Checks the claim
-- (by its secret lease token), the identity and the privileges again, and writes the job frame. In an
-- atomic attempt the KEY SHARE lock taken here is held until COMMIT: claims (FOR UPDATE SKIP LOCKED)
-- skip the row, so no other node can start this job meanwhile, while ALTER JOB is not blocked.
CREATE FUNCTION radix.begin_attempt(job uuid, token uuid) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s radix.radix_system_job_state;
    j radix.jobs;
BEGIN
    SELECT * INTO s FROM radix.radix_system_job_state
    WHERE job_id = job AND lease_token = token AND status = 'running' FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the claim of this attempt is no longer held' USING ERRCODE = 'RXL01';
    END IF;
    SELECT * INTO j FROM radix.jobs WHERE job_id = job;
    IF (SELECT oid FROM pg_roles WHERE rolname = session_user) <> j.principal_oid THEN
        RAISE EXCEPTION 'permission denied: the attempt is not logged in as its principal'
            USING ERRCODE = '42501';
    END IF;
    IF NOT radix.may_act_as(j.owner_oid, j.principal_oid) THEN
        RAISE EXCEPTION 'permission denied: the job owner may no longer act as its principal'
            USING ERRCODE = '42501';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_proc WHERE oid = j.procedure_oid AND prokind = 'p'
                   AND oid::regprocedure::text = j.procedure_signature) THEN
        RAISE EXCEPTION 'procedure % no longer exists', j.procedure_signature USING ERRCODE = '42883';
    END IF;
    IF NOT has_database_privilege(j.principal_oid, current_database(), 'CONNECT')
       OR NOT has_schema_privilege(j.principal_oid,
                                   (SELECT pronamespace FROM pg_proc WHERE oid = j.procedure_oid), 'USAGE')
       OR NOT has_function_privilege(j.principal_oid, j.procedure_oid, 'EXECUTE') THEN
        RAISE EXCEPTION 'permission denied for procedure %', j.procedure_signature USING ERRCODE = '42501';
    END IF;
    INSERT INTO radix.attempt_frames AS f
        (pid, backend_start, job_id, attempt, planned_ns, idempotency_key, lease_token)
    VALUES (pg_backend_pid(), (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a),
            job, s.attempt, s.planned_ns, s.idempotency_key, token)
    ON CONFLICT (pid) DO UPDATE SET backend_start = excluded.backend_start, job_id = excluded.job_id,
        attempt = excluded.attempt, planned_ns = excluded.planned_ns,
        idempotency_key = excluded.idempotency_key, lease_token = excluded.lease_token;
END $$;

-- Last statement of an attempt on the principal's connection. Atomic: marks the tick succeeded in the
-- attempt's own transaction — fenced by the lease token, so a lost lease (ALTER JOB, expiry, another
-- node) raises and rolls the procedure's effects back: the effects and the marker commit together or
-- not at all. Non-atomic: only closes the frame; the scheduler records the outcome.
CREATE FUNCTION radix.end_attempt(job uuid, token uuid, next_planned_ns bigint, atomic boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f radix.attempt_frames;
BEGIN
    DELETE FROM radix.attempt_frames WHERE pid = pg_backend_pid() AND job_id = job AND lease_token = token
    RETURNING * INTO f;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the frame of this attempt is gone' USING ERRCODE = 'RXL01';
    END IF;
    IF atomic THEN
        IF NOT radix._advance(job, token, next_planned_ns, true, NULL) THEN
            RAISE EXCEPTION 'the claim of this attempt is no longer held' USING ERRCODE = 'RXL01';
        END IF;
        UPDATE radix.radix_system_job_history
        SET status = 'succeeded', atomic = true, finished_at = clock_timestamp()
        WHERE job_id = job AND planned_ns = f.planned_ns AND attempt = f.attempt AND status = 'running';
    END IF;
END $$;

-- finish_attempt: the scheduler records an outcome it observed (failure, retry, or a non-atomic
-- success), fenced by the lease token. Returns false when the lease was lost (nothing changed).
--   outcome 'succeeded' | 'retrying' (due again after retry_delay_ns) | 'failed' (terminal for the tick)
CREATE FUNCTION radix.finish_attempt(job uuid, token uuid, outcome text, error jsonb,
                                     retry_delay_ns bigint, next_planned_ns bigint,
                                     atomic boolean, mark_non_atomic boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s radix.radix_system_job_state;
    ok boolean;
BEGIN
    SELECT * INTO s FROM radix.radix_system_job_state
    WHERE job_id = job AND lease_token = token AND status = 'running' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF outcome = 'retrying' THEN
        UPDATE radix.radix_system_job_state SET status = 'retry_wait',
            due_ns = radix.to_ns(clock_timestamp()) + retry_delay_ns,
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, last_error = error,
            updated_at = clock_timestamp()
        WHERE job_id = job;
    ELSE
        ok := radix._advance(job, token, next_planned_ns, outcome = 'succeeded', error);
    END IF;
    UPDATE radix.radix_system_job_history SET status = outcome, error = finish_attempt.error,
        finished_at = clock_timestamp(), atomic = finish_attempt.atomic
    WHERE job_id = job AND planned_ns = s.planned_ns AND attempt = s.attempt AND status = 'running';
    IF mark_non_atomic THEN
        UPDATE radix.jobs SET non_atomic = true WHERE job_id = job AND NOT non_atomic;
    END IF;
    DELETE FROM radix.attempt_frames WHERE job_id = job AND lease_token = token;
    RETURN true;
END $$;

-- release_claims: a node shutting down hands back the claims it holds but is not running.
CREATE FUNCTION radix.release_claims(node text) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH released AS (
        UPDATE radix.radix_system_job_state s SET status = CASE WHEN s.attempt > 1 THEN 'retry_wait'
                                                               ELSE 'scheduled' END,
            attempt = s.attempt - 1, due_ns = radix.to_ns(clock_timestamp()),
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = clock_timestamp()
        WHERE s.lease_node = node AND s.status = 'running' AND NOT radix.job_has_live_frame(s.job_id)
        RETURNING s.job_id, s.planned_ns, s.attempt + 1 AS attempt
    ), closed AS (
        UPDATE radix.radix_system_job_history h SET status = 'released', finished_at = clock_timestamp()
        FROM released r WHERE h.job_id = r.job_id AND h.planned_ns = r.planned_ns
          AND h.attempt = r.attempt AND h.status = 'running'
        RETURNING 1
    )
    SELECT count(*)::integer FROM released
$$;

-- The job frame, readable (never writable) by the procedure: NULL outside a job attempt.
CREATE FUNCTION radix._frame() RETURNS radix.attempt_frames
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN (SELECT f FROM radix.attempt_frames f
        WHERE f.pid = pg_backend_pid() AND EXISTS (
            SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start));

-- The readers return one value each; the frame row itself (with its secret lease token) is not for
-- the procedure: radix._frame() is not granted to PUBLIC.
CREATE FUNCTION radix.current_job_id() RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN (radix._frame()).job_id;
CREATE FUNCTION radix.current_job_attempt() RETURNS integer
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN (radix._frame()).attempt;
CREATE FUNCTION radix.current_job_scheduled_at() RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN radix.from_ns((radix._frame()).planned_ns);
CREATE FUNCTION radix.current_idempotency_key() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN (radix._frame()).idempotency_key;

-- once(): true the first time the current tick's idempotency key is seen, false after. For procedures
-- that commit inside (run at-least-once): `IF radix.once() THEN <effect>; END IF; COMMIT;` makes the
-- effect and the key commit together, so a resumed tick skips it.
CREATE FUNCTION radix.once() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f radix.attempt_frames := radix._frame();
BEGIN
    IF f.job_id IS NULL THEN
        RAISE EXCEPTION 'radix.once() can only be called inside a job attempt' USING ERRCODE = '55000';
    END IF;
    INSERT INTO radix.idempotency_keys (idempotency_key, job_id) VALUES (f.idempotency_key, f.job_id)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END $$;

REVOKE ALL ON FUNCTION radix.register_node(text, text, integer), radix.claim_due(text, integer, boolean),
    radix._advance(uuid, uuid, bigint, boolean, jsonb),
    radix.finish_attempt(uuid, uuid, text, jsonb, bigint, bigint, boolean, boolean), radix.release_claims(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION radix.begin_attempt(uuid, uuid), radix.end_attempt(uuid, uuid, bigint, boolean),
    radix.current_job_id(), radix.current_job_attempt(), radix.current_job_scheduled_at(),
    radix.current_idempotency_key(), radix.once() TO PUBLIC;
REVOKE ALL ON FUNCTION radix._frame() FROM PUBLIC;

-- ===== 0004_documents.sql =====
-- 0004: CRON_TABLE documents (the DocScheduler front-end, SPEC §6): storage, validation, admission,
-- system processes and the scheduler's verbs.
--
-- A document {"dockind": "CRON_TABLE", "status": ..., "props": {...}} is one row of radix.cron_table:
-- `props` holds the definition as the user gave it (maintained properties are never stored there, RUN_AS
-- is resolved), typed columns hold what the scheduler maintains. Documents are written only through
-- radix.apply_document(s), which validate the WHOLE input and name every problem before writing
-- anything; the Python API checks the same rules first (documents/model.py: keep the texts identical).

CREATE TABLE radix.cron_table (
    num              text PRIMARY KEY,
    dockind          text NOT NULL DEFAULT 'CRON_TABLE' CHECK (dockind = 'CRON_TABLE'),
    status           text NOT NULL CHECK (status IN
                       ('CRON_TABLE_ACTIVE', 'CRON_TABLE_PASSIVE', 'CRON_TABLE_ERROR')),
    props            jsonb NOT NULL,
    owner_oid        oid NOT NULL,          -- the role that created the document
    writer_oid       oid NOT NULL,          -- the role whose apply last changed it: RUN_AS was checked for it
    principal_oid    oid NOT NULL,          -- RUN_AS
    version          bigint NOT NULL DEFAULT 1,
    first_run        timestamptz,
    -- maintained by the scheduler
    sys_process_id   bigint,
    count_error      integer NOT NULL DEFAULT 0,
    last_run         timestamptz,
    next_run         timestamptz,
    daily_start_time timestamptz,
    daily_end_time   timestamptz,
    error_text       text,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE radix.sys_processes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_num    text NOT NULL REFERENCES radix.cron_table ON DELETE CASCADE,
    doc_version bigint NOT NULL,
    type        text NOT NULL CHECK (type IN ('db', 'csp')),
    target      text NOT NULL,
    params      jsonb,
    status      text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'completed', 'failed')),
    error_text  text,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    node        text NOT NULL
);
CREATE INDEX sys_processes_task ON radix.sys_processes (task_num, id);

REVOKE ALL ON radix.cron_table, radix.sys_processes FROM PUBLIC;

-- Every change of a document or of a process's status wakes the schedulers at once (the seed's
-- reload on change and trgProcessChanged); the payload is the task's NUM.
CREATE FUNCTION radix._notify_document() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('radix_documents', OLD.num);
    ELSE
        PERFORM pg_notify('radix_documents', NEW.num);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION radix._notify_process() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('radix_documents', NEW.task_num);
    RETURN NULL;
END $$;

CREATE TRIGGER "trgCronTableChanged" AFTER INSERT OR UPDATE OR DELETE ON radix.cron_table
    FOR EACH ROW EXECUTE FUNCTION radix._notify_document();
CREATE TRIGGER "trgProcessChanged" AFTER INSERT OR UPDATE OF status ON radix.sys_processes
    FOR EACH ROW EXECUTE FUNCTION radix._notify_process();

-- -- validation ---------------------------------------------------------------------------------------

CREATE FUNCTION radix._doc_present(v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE
RETURN v IS NOT NULL AND jsonb_typeof(v) <> 'null';

-- The task key of a document: an integer NUM as its digits, a string NUM as given; NULL when invalid.
CREATE FUNCTION radix.document_num(doc jsonb) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN (SELECT CASE
          WHEN jsonb_typeof(n) = 'number' AND n::text ~ '^-?[0-9]{1,100}$' THEN n::text
          WHEN jsonb_typeof(n) = 'string' AND btrim(n #>> '{}') <> '' AND length(n #>> '{}') <= 100
               THEN n #>> '{}'
        END
        FROM (SELECT CASE WHEN jsonb_typeof(doc) = 'object' AND jsonb_typeof(doc->'props') = 'object'
                          THEN doc->'props'->'NUM' END AS n) x);

-- Is `name` a function name: `name` or `schema.name`, PostgreSQL identifier rules, each part <= 63 bytes?
CREATE FUNCTION radix._doc_function_name_ok(name text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    parts text[];
BEGIN
    parts := parse_ident(name);
    RETURN cardinality(parts) IN (1, 2) AND (SELECT bool_and(octet_length(p) <= 63) FROM unnest(parts) p);
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END $$;

CREATE FUNCTION radix._doc_json_text_ok(s text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM s::jsonb;
    RETURN true;
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END $$;

CREATE FUNCTION radix._doc_timestamp_ok(s text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
AS $$
BEGIN
    IF s !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)?)?$' THEN
        RETURN false;
    END IF;
    PERFORM s::timestamptz;
    RETURN true;
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END $$;

-- Every structural problem of one document, in a fixed order (empty: valid). Pure: no catalog
-- lookups; RUN_AS and ownership are checked by the apply functions. Texts match documents/model.py.
CREATE FUNCTION radix.document_problems(doc jsonb) RETURNS text[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    known text[] := ARRAY['NUM', 'DESCR', 'DB_FUNCTION', 'CSP_SERVICE', 'CSP_SERVICE_PARAMS', 'INTERVAL',
                          'INTERVAL_ERROR', 'MAX_COUNT_ERROR', 'FIRST_RUN', 'RUN_AS', 'PERIODICAL_RUN',
                          'DEL_ON_FINISH', 'SYS_PROCESS_ID', 'COUNT_ERROR', 'LAST_RUN', 'NEXT_RUN',
                          'DAILY_START_TIME', 'DAILY_END_TIME', 'ERROR_TEXT'];
    statuses text := 'CRON_TABLE_ACTIVE, CRON_TABLE_PASSIVE or CRON_TABLE_ERROR';
    out text[] := '{}';
    p jsonb;
    v jsonb;
    k text;
    has_db boolean;
    has_csp boolean;
BEGIN
    IF jsonb_typeof(doc) IS DISTINCT FROM 'object' THEN
        RETURN ARRAY['a document must be a JSON object'];
    END IF;
    FOR k IN SELECT key FROM jsonb_object_keys(doc) key
             WHERE key NOT IN ('dockind', 'status', 'props') ORDER BY key COLLATE "C" LOOP
        out := out || format('unknown key %s (a document has dockind, status and props)', quote_literal(k));
    END LOOP;
    v := doc->'dockind';
    IF NOT radix._doc_present(v) THEN
        out := out || 'dockind is missing'::text;
    ELSIF v IS DISTINCT FROM '"CRON_TABLE"' THEN
        out := out || ('dockind must be ''CRON_TABLE'''
                       || CASE WHEN jsonb_typeof(v) = 'string' THEN ', not ' || quote_literal(v #>> '{}') ELSE '' END);
    END IF;
    v := doc->'status';
    IF NOT radix._doc_present(v) THEN
        out := out || ('status is missing (' || statuses || ')');
    ELSIF jsonb_typeof(v) <> 'string'
          OR v #>> '{}' NOT IN ('CRON_TABLE_ACTIVE', 'CRON_TABLE_PASSIVE', 'CRON_TABLE_ERROR') THEN
        out := out || ('status must be ' || statuses
                       || CASE WHEN jsonb_typeof(v) = 'string' THEN ', not ' || quote_literal(v #>> '{}') ELSE '' END);
    END IF;
    p := doc->'props';
    IF NOT radix._doc_present(p) THEN
        RETURN out || 'props is missing'::text;
    ELSIF jsonb_typeof(p) <> 'object' THEN
        RETURN out || 'props must be a JSON object'::text;
    END IF;

    FOR k IN SELECT key FROM jsonb_object_keys(p) key WHERE key <> ALL (known) ORDER BY key COLLATE "C" LOOP
        out := out || (format('unknown property %s', quote_literal(k))
                       || CASE WHEN upper(k) = ANY (known)
                               THEN format(' (property names are upper case: %s)', upper(k)) ELSE '' END);
    END LOOP;
    IF NOT radix._doc_present(p->'NUM') THEN
        out := out || 'NUM is missing'::text;
    ELSIF radix.document_num(doc) IS NULL THEN
        out := out || 'NUM must be an integer or a non-empty string (at most 100 characters)'::text;
    END IF;
    IF radix._doc_present(p->'DESCR') AND jsonb_typeof(p->'DESCR') <> 'string' THEN
        out := out || 'DESCR must be a string'::text;
    END IF;
    has_db := radix._doc_present(p->'DB_FUNCTION');
    has_csp := radix._doc_present(p->'CSP_SERVICE');
    IF NOT has_db AND NOT has_csp THEN
        out := out || 'one of DB_FUNCTION and CSP_SERVICE is required'::text;
    ELSIF has_db AND has_csp THEN
        out := out || 'DB_FUNCTION and CSP_SERVICE exclude each other: give exactly one'::text;
    END IF;
    v := p->'DB_FUNCTION';
    IF has_db AND jsonb_typeof(v) <> 'string' THEN
        out := out || 'DB_FUNCTION must be a string'::text;
    ELSIF has_db AND NOT radix._doc_function_name_ok(v #>> '{}') THEN
        out := out || format('DB_FUNCTION must be a function name (name or schema.name), not %s',
                             quote_literal(v #>> '{}'));
    END IF;
    IF has_csp AND (jsonb_typeof(p->'CSP_SERVICE') <> 'string' OR btrim(p->>'CSP_SERVICE') = '') THEN
        out := out || 'CSP_SERVICE must be a non-empty string'::text;
    END IF;
    v := p->'CSP_SERVICE_PARAMS';
    IF radix._doc_present(v) THEN
        IF NOT has_csp THEN
            out := out || 'CSP_SERVICE_PARAMS is only used with CSP_SERVICE'::text;
        END IF;
        IF jsonb_typeof(v) = 'string' AND NOT radix._doc_json_text_ok(v #>> '{}') THEN
            out := out || 'CSP_SERVICE_PARAMS is a string but not valid JSON'::text;
        ELSIF jsonb_typeof(v) NOT IN ('string', 'object', 'array') THEN
            out := out || 'CSP_SERVICE_PARAMS must be a JSON object or array, or a string holding JSON'::text;
        END IF;
    END IF;
    FOREACH k IN ARRAY ARRAY['INTERVAL', 'INTERVAL_ERROR'] LOOP
        IF radix._doc_present(p->k) AND jsonb_typeof(p->k) <> 'string' THEN
            out := out || (k || ' must be a string (a SQL expression)');
        END IF;
    END LOOP;
    v := p->'MAX_COUNT_ERROR';
    IF radix._doc_present(v) AND NOT (jsonb_typeof(v) = 'number' AND v::text ~ '^[0-9]{1,10}$'
                                      AND v::text::bigint <= 2147483647) THEN
        out := out || 'MAX_COUNT_ERROR must be an integer from 0 to 2147483647'::text;
    END IF;
    v := p->'FIRST_RUN';
    IF radix._doc_present(v) AND NOT (jsonb_typeof(v) = 'string' AND radix._doc_timestamp_ok(v #>> '{}')) THEN
        out := out || ('FIRST_RUN must be an ISO-8601 timestamp such as 2025-01-01T00:00:00'
                       || CASE WHEN jsonb_typeof(v) = 'string' THEN ', not ' || quote_literal(v #>> '{}') ELSE '' END);
    END IF;
    v := p->'RUN_AS';
    IF radix._doc_present(v) AND (jsonb_typeof(v) <> 'string' OR btrim(v #>> '{}') = '') THEN
        out := out || 'RUN_AS must be a role name'::text;
    END IF;
    RETURN out;
END $$;

-- -- admission ------------------------------------------------------------------------------------------

CREATE FUNCTION radix._doc_prefix(doc jsonb, pos integer, single boolean) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN single THEN coalesce('NUM ' || radix.document_num(doc) || ': ', '')
            ELSE 'document ' || pos || coalesce(' (NUM ' || radix.document_num(doc) || ')', '') || ': ' END;

-- What `caller` may not do with a structurally valid document: RUN_AS (exists, may act as it, can log
-- in) and ownership of an existing document. Returns (problem, is_permission) rows.
CREATE FUNCTION radix._doc_access_problems(caller oid, doc jsonb)
RETURNS TABLE (problem text, permission boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    run_as text := coalesce(doc->'props'->>'RUN_AS', (SELECT rolname FROM pg_roles WHERE oid = caller));
    principal pg_roles;
    owner oid := (SELECT owner_oid FROM radix.cron_table WHERE num = radix.document_num(doc));
BEGIN
    IF owner IS NOT NULL AND NOT (SELECT rolsuper FROM pg_roles WHERE oid = caller)
       AND NOT (EXISTS (SELECT 1 FROM pg_roles WHERE oid = owner) AND pg_has_role(caller, owner, 'MEMBER')) THEN
        RETURN QUERY SELECT format('permission denied: task %s belongs to role %s; only its owner (or a member '
                                   'of it) may change it', radix.document_num(doc), pg_get_userbyid(owner)), true;
    END IF;
    SELECT * INTO principal FROM pg_roles WHERE rolname = run_as;
    IF NOT FOUND THEN
        RETURN QUERY SELECT format('RUN_AS role %s does not exist', quote_literal(run_as)), false;
    ELSIF NOT radix.may_act_as(caller, principal.oid) THEN
        RETURN QUERY SELECT CASE WHEN principal.rolsuper
            THEN format('permission denied to run as superuser %s: only superusers may', quote_ident(run_as))
            ELSE format('permission denied to run as role %s: the writer must be able to SET ROLE to it',
                        quote_ident(run_as)) END, true;
    ELSIF NOT principal.rolcanlogin THEN
        RETURN QUERY SELECT format('role %s cannot log in: tasks run on a connection logged in as RUN_AS '
                                   '(ALTER ROLE %s LOGIN)', quote_ident(run_as), quote_ident(run_as)), false;
    END IF;
END $$;

-- Write one checked document (its key is locked by the caller). Identical definition and status:
-- nothing changes. Otherwise the version goes up; a status set back to ACTIVE re-arms the task
-- (error counter, error text and NEXT_RUN cleared: due at FIRST_RUN, or now). Run state is kept.
CREATE FUNCTION radix._doc_write(caller oid, doc jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
AS $$
DECLARE
    maintained text[] := ARRAY['SYS_PROCESS_ID', 'COUNT_ERROR', 'LAST_RUN', 'NEXT_RUN', 'DAILY_START_TIME',
                               'DAILY_END_TIME', 'ERROR_TEXT'];
    key text := radix.document_num(doc);
    principal pg_roles;
    new_props jsonb;
    new_status text := doc->>'status';
    ignored jsonb := (SELECT coalesce(jsonb_agg(k ORDER BY k COLLATE "C"), '[]')
                      FROM jsonb_object_keys(doc->'props') k WHERE k = ANY (maintained));
    old radix.cron_table;
    rearm boolean;
BEGIN
    SELECT * INTO principal FROM pg_roles
    WHERE rolname = coalesce(doc->'props'->>'RUN_AS', (SELECT rolname FROM pg_roles WHERE oid = caller));
    new_props := (SELECT coalesce(jsonb_object_agg(k, v), '{}') FROM jsonb_each(doc->'props') AS e(k, v)
              WHERE k <> ALL (maintained) AND jsonb_typeof(v) <> 'null')
             || jsonb_build_object('RUN_AS', principal.rolname);
    SELECT * INTO old FROM radix.cron_table WHERE num = key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO radix.cron_table (num, status, props, owner_oid, writer_oid, principal_oid, first_run)
        VALUES (key, new_status, new_props, caller, caller, principal.oid, (new_props->>'FIRST_RUN')::timestamptz);
        RETURN jsonb_build_object('num', key, 'action', 'created', 'version', 1, 'ignored', ignored);
    END IF;
    IF old.props = new_props AND old.status = new_status THEN
        RETURN jsonb_build_object('num', key, 'action', 'unchanged', 'version', old.version, 'ignored', ignored);
    END IF;
    rearm := new_status = 'CRON_TABLE_ACTIVE' AND old.status <> 'CRON_TABLE_ACTIVE';
    UPDATE radix.cron_table c SET
        status = new_status, props = new_props, writer_oid = caller,
        principal_oid = principal.oid, version = c.version + 1,
        first_run = (new_props->>'FIRST_RUN')::timestamptz,
        count_error = CASE WHEN rearm THEN 0 ELSE c.count_error END,
        error_text = CASE WHEN rearm THEN NULL ELSE c.error_text END,
        next_run = CASE WHEN rearm THEN NULL ELSE c.next_run END,
        updated_at = clock_timestamp()
    WHERE c.num = key;
    RETURN jsonb_build_object('num', key, 'action', 'updated', 'version', old.version + 1, 'ignored', ignored);
END $$;

-- Apply a list of documents all-or-nothing: every problem of every document is named in one error
-- (DETAIL, one per line), or all are written. `single` only changes how problems are prefixed.
CREATE FUNCTION radix._apply_documents(creator name, docs jsonb, single boolean) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    problems text[] := '{}';
    permission boolean := false;
    d record;
    a record;
    results jsonb := '[]';
BEGIN
    IF jsonb_typeof(docs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'documents must be a JSON object or a list of objects' USING ERRCODE = '22023';
    END IF;
    FOR d IN SELECT e, n::integer AS n FROM jsonb_array_elements(docs) WITH ORDINALITY AS x(e, n) LOOP
        problems := problems || ARRAY(SELECT radix._doc_prefix(d.e, d.n, single) || m
                                      FROM unnest(radix.document_problems(d.e)) m);
    END LOOP;
    problems := problems || ARRAY(
        SELECT format('NUM %s appears more than once (documents %s)', k,
                      array_to_string(array_agg(n ORDER BY n), ', '))
        FROM (SELECT radix.document_num(e) AS k, n FROM jsonb_array_elements(docs) WITH ORDINALITY AS x(e, n)) s
        WHERE k IS NOT NULL GROUP BY k HAVING count(*) > 1 ORDER BY min(n));
    IF cardinality(problems) = 0 THEN
        -- lock every key in one order (concurrent lists cannot deadlock), then check access
        PERFORM pg_advisory_xact_lock(hashtext('radix.doc:' || k))
        FROM (SELECT radix.document_num(e) AS k FROM jsonb_array_elements(docs) e
              ORDER BY radix.document_num(e) COLLATE "C") s;
        FOR d IN SELECT e, n::integer AS n FROM jsonb_array_elements(docs) WITH ORDINALITY AS x(e, n) LOOP
            FOR a IN SELECT * FROM radix._doc_access_problems(caller, d.e) LOOP
                problems := problems || (radix._doc_prefix(d.e, d.n, single) || a.problem);
                permission := permission OR a.permission;
            END LOOP;
        END LOOP;
    END IF;
    IF cardinality(problems) > 0 THEN
        RAISE EXCEPTION '%', CASE WHEN cardinality(problems) = 1 THEN 'CRON_TABLE document rejected: ' || problems[1]
                                  ELSE format('CRON_TABLE document rejected: %s problems', cardinality(problems)) END
            USING ERRCODE = CASE WHEN permission THEN '42501' ELSE '22023' END,
                  DETAIL = array_to_string(problems, E'\n');
    END IF;
    FOR d IN SELECT e FROM jsonb_array_elements(docs) e LOOP
        results := results || radix._doc_write(caller, d.e);
    END LOOP;
    RETURN results;
END $$;

-- Public entry points (SECURITY INVOKER): the calling role is current_user at the call site.
-- apply_document returns {"num", "action": created | updated | unchanged, "version", "ignored": [...]}.
CREATE FUNCTION radix.apply_document(doc jsonb) RETURNS jsonb LANGUAGE sql VOLATILE
RETURN radix._apply_documents(current_user, jsonb_build_array(doc), true) -> 0;

CREATE FUNCTION radix.apply_documents(docs jsonb) RETURNS jsonb LANGUAGE sql VOLATILE
RETURN radix._apply_documents(current_user,
                              CASE WHEN jsonb_typeof(docs) = 'object' THEN jsonb_build_array(docs) ELSE docs END,
                              jsonb_typeof(docs) = 'object');

-- What a role may see: the documents it owns (directly or by membership); all for superusers.
CREATE FUNCTION radix._doc_visible(owner oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN true
            WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE oid = owner) THEN false
            ELSE pg_has_role(current_user, owner, 'MEMBER') END;

CREATE VIEW radix.document_overview WITH (security_barrier) AS
SELECT c.num, c.dockind, c.status, c.props, pg_get_userbyid(c.owner_oid) AS owner,
       pg_get_userbyid(c.principal_oid) AS principal, c.version, c.first_run, c.sys_process_id,
       c.count_error, c.last_run, c.next_run, c.daily_start_time, c.daily_end_time, c.error_text,
       CASE WHEN c.status = 'CRON_TABLE_ACTIVE' THEN coalesce(c.next_run, c.first_run) END AS next_run_at,
       c.created_at, c.updated_at
FROM radix.cron_table c
WHERE radix._doc_visible(c.owner_oid);

CREATE VIEW radix.document_processes WITH (security_barrier) AS
SELECT p.id, p.task_num AS num, p.doc_version, p.type, p.target, p.params, p.status, p.error_text,
       p.started_at, p.finished_at, p.finished_at - p.started_at AS duration, p.node
FROM radix.sys_processes p JOIN radix.cron_table c ON c.num = p.task_num
WHERE radix._doc_visible(c.owner_oid);

-- -- scheduler verbs (the scheduler's own role only) ---------------------------------------------------
-- `at_ts` is the scheduler's clock (NULL: the database clock). A process is live while it is running
-- and its node is alive; this node's own processes are live only while it runs them (`in_flight`).

-- Why the task may not run as its principal now (NULL: it may): checked at every start and finish.
CREATE FUNCTION radix._doc_refusal(c radix.cron_table) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN (SELECT CASE
          WHEN r.oid IS NULL THEN 'RUN_AS role no longer exists'
          WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE oid = c.writer_oid)
               OR NOT radix.may_act_as(c.writer_oid, c.principal_oid)
               THEN 'permission denied: the document''s writer may no longer act as RUN_AS'
          WHEN NOT r.rolcanlogin THEN format('role %s cannot log in', quote_ident(r.rolname))
        END
        FROM (SELECT 1) one LEFT JOIN pg_roles r ON r.oid = c.principal_oid);

-- The ACTIVE tasks the decision table must look at: due ones, and ones with a recorded process.
CREATE FUNCTION radix.doc_candidates(at_ts timestamptz, my_node text, in_flight bigint[])
RETURNS TABLE (num text, version bigint, due_at timestamptz, sys_process_id bigint, process_status text,
               process_live boolean, process_error text, now_ts timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.num, c.version, coalesce(c.next_run, c.first_run), c.sys_process_id, p.status,
           p.status = 'running' AND CASE WHEN p.node = my_node THEN p.id = ANY (in_flight)
                                         ELSE radix.node_alive(p.node) END,
           p.error_text, t.now_ts
    FROM (SELECT coalesce(at_ts, clock_timestamp()) AS now_ts) t
         CROSS JOIN radix.cron_table c LEFT JOIN radix.sys_processes p ON p.id = c.sys_process_id
    WHERE c.status = 'CRON_TABLE_ACTIVE'
      AND (c.sys_process_id IS NOT NULL OR coalesce(c.next_run, c.first_run, '-infinity') <= t.now_ts)
    ORDER BY coalesce(c.next_run, c.first_run, '-infinity'), c.num
$$;

-- Seconds until the earliest idle ACTIVE task is due (0: now, or a recorded process needs a look);
-- NULL when nothing is planned.
CREATE FUNCTION radix.doc_next_due_in(at_ts timestamptz, my_node text, in_flight bigint[]) RETURNS float8
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT greatest(0, extract(epoch FROM min(CASE
               WHEN c.sys_process_id IS NULL THEN coalesce(c.next_run, c.first_run, t.now_ts)
               WHEN p.status IS DISTINCT FROM 'running' THEN t.now_ts
               WHEN p.node = my_node AND NOT p.id = ANY (in_flight) THEN t.now_ts
               WHEN p.node <> my_node AND NOT radix.node_alive(p.node) THEN t.now_ts
           END) - t.now_ts))::float8
    FROM (SELECT coalesce(at_ts, clock_timestamp()) AS now_ts) t
         CROSS JOIN radix.cron_table c LEFT JOIN radix.sys_processes p ON p.id = c.sys_process_id
    WHERE c.status = 'CRON_TABLE_ACTIVE'
    GROUP BY t.now_ts
$$;

-- Start a run (the seed's _runTask): fenced by the process the decision saw (`expected_process`), the
-- status and the due time, so two schedulers never start one task twice. A replaced process that is
-- still marked running (its node died) is closed as failed. Creates the system process, records it in
-- SYS_PROCESS_ID and DAILY_START_TIME; `refusal` says why it must not run as its principal (it then
-- fails without running). No row: someone else holds or started the task.
CREATE FUNCTION radix.doc_start(task text, expected_process bigint, my_node text, at_ts timestamptz)
RETURNS TABLE (process_id bigint, kind text, target text, params jsonb, principal name, refusal text,
               started_at timestamptz, version bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c radix.cron_table;
    old radix.sys_processes;
    now_ts timestamptz := coalesce(at_ts, clock_timestamp());
    pid bigint;
    proc_kind text;
BEGIN
    SELECT * INTO c FROM radix.cron_table t WHERE t.num = task FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR c.status <> 'CRON_TABLE_ACTIVE' OR c.sys_process_id IS DISTINCT FROM expected_process
       OR coalesce(c.next_run, c.first_run, '-infinity') > now_ts THEN
        RETURN;
    END IF;
    IF expected_process IS NOT NULL THEN
        SELECT * INTO old FROM radix.sys_processes p WHERE p.id = expected_process FOR UPDATE;
        IF FOUND AND old.status <> 'running' THEN
            RETURN;  -- finished meanwhile: it is to be finished, not restarted
        END IF;
        IF FOUND AND old.node <> my_node AND radix.node_alive(old.node) THEN
            RETURN;
        END IF;
        UPDATE radix.sys_processes p SET status = 'failed', finished_at = now_ts,
            error_text = format('abandoned: node %s stopped before the process finished', p.node)
        WHERE p.id = expected_process AND p.status = 'running';
    END IF;
    proc_kind := CASE WHEN c.props ? 'DB_FUNCTION' THEN 'db' ELSE 'csp' END;
    INSERT INTO radix.sys_processes (task_num, doc_version, type, target, params, started_at, node)
    VALUES (c.num, c.version, proc_kind,
            CASE proc_kind WHEN 'db' THEN c.props->>'DB_FUNCTION' ELSE c.props->>'CSP_SERVICE' END,
            CASE WHEN jsonb_typeof(c.props->'CSP_SERVICE_PARAMS') = 'string'
                 THEN (c.props->>'CSP_SERVICE_PARAMS')::jsonb ELSE c.props->'CSP_SERVICE_PARAMS' END,
            now_ts, my_node)
    RETURNING id INTO pid;
    UPDATE radix.cron_table t SET sys_process_id = pid, daily_start_time = now_ts, updated_at = now_ts
    WHERE t.num = c.num;
    -- keep the newest 256 processes per task
    DELETE FROM radix.sys_processes p WHERE p.task_num = c.num AND p.id <= (
        SELECT q.id FROM radix.sys_processes q WHERE q.task_num = c.num ORDER BY q.id DESC OFFSET 256 LIMIT 1);
    RETURN QUERY SELECT pid, proc_kind, p.target, p.params, pg_get_userbyid(c.principal_oid)::name,
                        radix._doc_refusal(c), now_ts, c.version
    FROM radix.sys_processes p WHERE p.id = pid;
END $$;

-- Record a process's outcome (completed / failed). NULL when it was no longer running (another node
-- took the task over): the caller then stops. Returns the finish time.
CREATE FUNCTION radix.doc_record(process bigint, succeeded boolean, error text, at_ts timestamptz)
RETURNS timestamptz
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE radix.sys_processes SET status = CASE WHEN succeeded THEN 'completed' ELSE 'failed' END,
        error_text = error, finished_at = coalesce(at_ts, clock_timestamp())
    WHERE id = process AND status = 'running'
    RETURNING finished_at
$$;

-- What the finish of `process` needs; no row when the task no longer records that process.
CREATE FUNCTION radix.doc_finish_state(task text, process bigint)
RETURNS TABLE (version bigint, status text, props jsonb, count_error integer, daily_start_time timestamptz,
               principal name, refusal text, process_status text, process_error text,
               process_finished_at timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.version, c.status, c.props, c.count_error, c.daily_start_time,
           pg_get_userbyid(c.principal_oid)::name, radix._doc_refusal(c), p.status, p.error_text, p.finished_at
    FROM radix.cron_table c JOIN radix.sys_processes p ON p.id = c.sys_process_id
    WHERE c.num = task AND c.sys_process_id = process
$$;

-- Finish a run (the seed's _finishTask) in one transaction: SYS_PROCESS_ID cleared, DAILY_END_TIME,
-- LAST_RUN, ERROR_TEXT, NEXT_RUN and COUNT_ERROR written; the status changes only while ACTIVE (a
-- user's PASSIVE/ERROR wins). Fenced by the process and the definition version:
-- 'done', 'stale' (the document changed meanwhile: decide again) or 'lost' (no longer ours).
CREATE FUNCTION radix.doc_finish(task text, process bigint, expected_version bigint, new_status text,
                                 next_run timestamptz, count_error integer, error text, at_ts timestamptz)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c radix.cron_table;
    now_ts timestamptz := coalesce(at_ts, clock_timestamp());
BEGIN
    SELECT * INTO c FROM radix.cron_table t WHERE t.num = task FOR UPDATE;
    IF NOT FOUND OR c.sys_process_id IS DISTINCT FROM process THEN
        RETURN 'lost';
    END IF;
    IF c.version <> expected_version THEN
        RETURN 'stale';
    END IF;
    UPDATE radix.cron_table t SET sys_process_id = NULL, daily_end_time = now_ts,
        last_run = t.daily_start_time, error_text = error, next_run = doc_finish.next_run,
        count_error = doc_finish.count_error,
        status = CASE WHEN t.status = 'CRON_TABLE_ACTIVE' THEN new_status ELSE t.status END,
        updated_at = now_ts
    WHERE t.num = task;
    RETURN 'done';
END $$;

-- Full-reload housekeeping: a task that is no longer ACTIVE but still records a process that ended
-- (or whose node died) is released: the process is closed, SYS_PROCESS_ID cleared. Returns the count.
CREATE FUNCTION radix.doc_release_inactive(my_node text, in_flight bigint[], at_ts timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ts timestamptz := coalesce(at_ts, clock_timestamp());
    released integer;
BEGIN
    WITH stale AS (
        SELECT c.num, p.id, p.status, p.finished_at, p.error_text
        FROM radix.cron_table c LEFT JOIN radix.sys_processes p ON p.id = c.sys_process_id
        WHERE c.status <> 'CRON_TABLE_ACTIVE' AND c.sys_process_id IS NOT NULL
          AND NOT c.sys_process_id = ANY (in_flight)
          AND (p.id IS NULL OR p.status <> 'running'
               OR CASE WHEN p.node = my_node THEN true ELSE NOT radix.node_alive(p.node) END)
        FOR UPDATE OF c SKIP LOCKED
    ), closed AS (
        UPDATE radix.sys_processes p SET status = 'failed', finished_at = now_ts,
            error_text = format('abandoned: node %s stopped before the process finished', p.node)
        FROM stale s WHERE p.id = s.id AND p.status = 'running'
        RETURNING p.id
    ), cleared AS (
        UPDATE radix.cron_table t SET sys_process_id = NULL, last_run = t.daily_start_time,
            daily_end_time = coalesce(s.finished_at, now_ts),
            error_text = CASE WHEN s.status = 'completed' THEN NULL
                              ELSE coalesce(s.error_text, 'abandoned: the process was lost') END,
            updated_at = now_ts
        FROM stale s WHERE t.num = s.num
        RETURNING 1
    )
    SELECT count(*) INTO released FROM cleared;
    RETURN released;
END $$;

REVOKE ALL ON FUNCTION radix._doc_access_problems(oid, jsonb), radix._doc_write(oid, jsonb),
    radix._doc_refusal(radix.cron_table), radix.doc_candidates(timestamptz, text, bigint[]),
    radix.doc_next_due_in(timestamptz, text, bigint[]), radix.doc_start(text, bigint, text, timestamptz),
    radix.doc_record(bigint, boolean, text, timestamptz), radix.doc_finish_state(text, bigint),
    radix.doc_finish(text, bigint, bigint, text, timestamptz, integer, text, timestamptz),
    radix.doc_release_inactive(text, bigint[], timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION radix.document_problems(jsonb), radix.document_num(jsonb),
    radix._apply_documents(name, jsonb, boolean), radix.apply_document(jsonb), radix.apply_documents(jsonb)
    TO PUBLIC;
GRANT SELECT ON radix.document_overview, radix.document_processes TO PUBLIC;

-- ===== 0005_owners_services.sql =====
-- 0005: who may use which CSP service, and ownership as PostgreSQL has it (issue #11, items 3 and 11).
--
-- CSP services. The daemon registers the code (`--service NAME=module:function`, entry points); the
-- database says who may use a name: radix.service_grants, written only by radix.grant_service /
-- radix.revoke_service (the radix schema owner, superusers, and whoever they grant EXECUTE to). A document
-- may name CSP_SERVICE only when its writer is a superuser or its RUN_AS principal has the privileges
-- (pg_has_role USAGE) of a role the service is granted to (grantee 0: PUBLIC). Checked at apply
-- (radix._doc_access_problems) and again at every start (radix._doc_refusal, read by radix.doc_start
-- before any service code runs). A refusal says the same for an unknown and an ungranted name and never
-- lists services.
--
-- Ownership. A role acts as the owner of a job or document when it has the owner's privileges
-- (pg_has_role USAGE: the owner itself, or membership with INHERIT), PostgreSQL's rule for owning
-- objects; bare membership (INHERIT FALSE, SET FALSE) no longer counts. RUN AS keeps the SET rule
-- (radix.may_act_as). A refusal for a taken document NUM never names the owner.

CREATE TABLE radix.service_grants (
    service    text NOT NULL CHECK (btrim(service) <> '' AND length(service) <= 200),
    grantee    oid NOT NULL,                 -- 0: PUBLIC
    granted_by oid NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (service, grantee)
);
REVOKE ALL ON radix.service_grants FROM PUBLIC;

-- May a document written by `writer` that runs as `principal` use `service`? Roles that no longer
-- exist count as nothing.
CREATE FUNCTION radix._service_usable(service text, writer oid, principal oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT rolsuper FROM pg_roles WHERE oid = writer), false)
    OR (EXISTS (SELECT 1 FROM pg_roles WHERE oid = principal)
        AND EXISTS (SELECT 1 FROM radix.service_grants g
                    WHERE g.service = _service_usable.service
                      AND CASE WHEN g.grantee = 0 THEN true
                               WHEN NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = g.grantee) THEN false
                               ELSE pg_has_role(principal, g.grantee, 'USAGE') END));

-- A grantee given as a role name, or PUBLIC (0); raises for an unknown role.
CREATE FUNCTION radix._service_grantee(grantee name) RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r oid := (SELECT oid FROM pg_roles WHERE rolname = grantee);
BEGIN
    IF r IS NOT NULL THEN
        RETURN r;
    ELSIF lower(grantee) = 'public' THEN
        RETURN 0;
    END IF;
    RAISE EXCEPTION 'role % does not exist', quote_ident(grantee) USING ERRCODE = '42704';
END $$;

-- Grants to roles that were dropped count as nothing; the operator's verbs delete them too (an OID can be
-- reused by a later role).
CREATE FUNCTION radix._forget_dropped_grantees() RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM radix.service_grants g
    WHERE g.grantee <> 0 AND NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = g.grantee)
$$;

-- The operator's verbs. true: the grant was added (grant) or removed (revoke); false: nothing changed.
CREATE FUNCTION radix.grant_service(service text, grantee name) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    added integer;
BEGIN
    IF grant_service.service IS NULL OR btrim(grant_service.service) = ''
       OR length(grant_service.service) > 200 THEN
        RAISE EXCEPTION 'a CSP service name must be a non-empty string of at most 200 characters'
            USING ERRCODE = '22023';
    END IF;
    PERFORM radix._forget_dropped_grantees();
    INSERT INTO radix.service_grants (service, grantee, granted_by)
    VALUES (grant_service.service, radix._service_grantee(grant_service.grantee),
            (SELECT oid FROM pg_roles WHERE rolname = session_user))
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added > 0;
END $$;

CREATE FUNCTION radix.revoke_service(service text, grantee name) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    removed integer;
BEGIN
    PERFORM radix._forget_dropped_grantees();
    DELETE FROM radix.service_grants g WHERE g.service = revoke_service.service
        AND g.grantee = radix._service_grantee(revoke_service.grantee);
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed > 0;
END $$;

-- The grants a role may see: all of them for the operator (a superuser, or a role with the privileges
-- of the radix schema's owner); for anyone else only the grants it benefits from (PUBLIC, or a role whose
-- privileges it has), so no role learns the names of services it may not use.
CREATE FUNCTION radix._service_grant_visible(grantee oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN true
            WHEN pg_has_role(current_user, (SELECT nspowner FROM pg_namespace WHERE nspname = 'radix'), 'USAGE')
                 THEN true
            WHEN grantee = 0 THEN true
            WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE oid = grantee) THEN false
            ELSE pg_has_role(current_user, grantee, 'USAGE') END;

CREATE VIEW radix.csp_services WITH (security_barrier) AS
SELECT g.service, CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(g.grantee) END AS grantee,
       pg_get_userbyid(g.granted_by) AS granted_by, g.granted_at
FROM radix.service_grants g
WHERE radix._service_grant_visible(g.grantee);

-- -- ownership: the privileges of the owner (USAGE) --------------------------------------------------------

CREATE OR REPLACE FUNCTION radix._check_job_owner(j radix.jobs, caller oid) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT (coalesce((SELECT rolsuper FROM pg_roles WHERE oid = caller), false)
            OR (EXISTS (SELECT 1 FROM pg_roles WHERE oid = j.owner_oid)
                AND pg_has_role(caller, j.owner_oid, 'USAGE'))) THEN
        RAISE EXCEPTION 'must be owner of job %.%', quote_ident(j.schema_name), quote_ident(j.job_name)
            USING ERRCODE = '42501';
    END IF;
END $$;

-- Whether the current role sees a job or document owned by `owner`: it has the owner's privileges, or
-- it is a superuser.
CREATE FUNCTION radix._owner_visible(owner oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN true
            WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE oid = owner) THEN false
            ELSE pg_has_role(current_user, owner, 'USAGE') END;

-- What a role may see of the catalog: the jobs whose owner's privileges it has; all for superusers.
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
       s.status, s.planned_ns, radix.from_ns(s.planned_ns) AS next_run_at, s.attempt, s.due_ns,
       s.idempotency_key, s.lease_node, s.lease_expires_at, s.coalesced_ticks, s.last_error
FROM radix.jobs j LEFT JOIN radix.radix_system_job_state s USING (job_id)
WHERE radix._owner_visible(j.owner_oid);

CREATE OR REPLACE VIEW radix.job_history WITH (security_barrier) AS
SELECT h.history_id, h.job_id, quote_ident(j.schema_name) || '.' || quote_ident(j.job_name) AS name,
       h.definition_version, h.planned_ns, radix.from_ns(h.planned_ns) AS planned_at, h.attempt,
       h.idempotency_key, h.status, h.node, h.atomic, h.started_at, h.finished_at,
       h.finished_at - h.started_at AS duration, h.error
FROM radix.radix_system_job_history h JOIN radix.jobs j USING (job_id)
WHERE radix._owner_visible(j.owner_oid);

-- What `caller` may not do with a structurally valid document: ownership of an existing document (the
-- owner's privileges), RUN_AS (exists, may act as it, can log in) and its CSP service (granted).
-- Returns (problem, is_permission) rows.
CREATE OR REPLACE FUNCTION radix._doc_access_problems(caller oid, doc jsonb)
RETURNS TABLE (problem text, permission boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    run_as text := coalesce(doc->'props'->>'RUN_AS', (SELECT rolname FROM pg_roles WHERE oid = caller));
    principal pg_roles;
    service text := doc->'props'->>'CSP_SERVICE';
    owner oid := (SELECT owner_oid FROM radix.cron_table WHERE num = radix.document_num(doc));
BEGIN
    IF owner IS NOT NULL AND NOT coalesce((SELECT rolsuper FROM pg_roles WHERE oid = caller), false)
       AND NOT (EXISTS (SELECT 1 FROM pg_roles WHERE oid = owner) AND pg_has_role(caller, owner, 'USAGE')) THEN
        RETURN QUERY SELECT format('permission denied: document NUM %s belongs to another role; only a role '
                                   'with its owner''s privileges may change it', radix.document_num(doc)), true;
    END IF;
    SELECT * INTO principal FROM pg_roles WHERE rolname = run_as;
    IF NOT FOUND THEN
        RETURN QUERY SELECT format('RUN_AS role %s does not exist', quote_literal(run_as)), false;
        RETURN;
    ELSIF NOT radix.may_act_as(caller, principal.oid) THEN
        RETURN QUERY SELECT CASE WHEN principal.rolsuper
            THEN format('permission denied to run as superuser %s: only superusers may', quote_ident(run_as))
            ELSE format('permission denied to run as role %s: the writer must be able to SET ROLE to it',
                        quote_ident(run_as)) END, true;
    ELSIF NOT principal.rolcanlogin THEN
        RETURN QUERY SELECT format('role %s cannot log in: tasks run on a connection logged in as RUN_AS '
                                   '(ALTER ROLE %s LOGIN)', quote_ident(run_as), quote_ident(run_as)), false;
    END IF;
    IF service IS NOT NULL AND NOT radix._service_usable(service, caller, principal.oid) THEN
        RETURN QUERY SELECT format('permission denied: CSP service %s is not available to RUN_AS role %s '
                                   '(the operator grants services: radix.grant_service)',
                                   quote_literal(service), quote_ident(run_as)), true;
    END IF;
END $$;

-- What a role may see: the documents whose owner's privileges it has; all for superusers. The document
-- views call this, so they follow.
CREATE OR REPLACE FUNCTION radix._doc_visible(owner oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN radix._owner_visible(owner);

-- Why the task may not run now (NULL: it may): checked at every start (before any code runs) and finish.
-- The service refusal names nothing: the document's owner knows what it named.
CREATE OR REPLACE FUNCTION radix._doc_refusal(c radix.cron_table) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN (SELECT CASE
          WHEN r.oid IS NULL THEN 'RUN_AS role no longer exists'
          WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE oid = c.writer_oid)
               OR NOT radix.may_act_as(c.writer_oid, c.principal_oid)
               THEN 'permission denied: the document''s writer may no longer act as RUN_AS'
          WHEN NOT r.rolcanlogin THEN format('role %s cannot log in', quote_ident(r.rolname))
          WHEN c.props ? 'CSP_SERVICE'
               AND NOT radix._service_usable(c.props->>'CSP_SERVICE', c.writer_oid, c.principal_oid)
               THEN '[42501] permission denied: the CSP service is not granted to RUN_AS (redacted)'
        END
        FROM (SELECT 1) one LEFT JOIN pg_roles r ON r.oid = c.principal_oid);

REVOKE ALL ON FUNCTION radix._service_usable(text, oid, oid), radix._service_grantee(name),
    radix._forget_dropped_grantees(),
    radix.grant_service(text, name), radix.revoke_service(text, name) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION radix._service_grant_visible(oid), radix._owner_visible(oid) TO PUBLIC;
GRANT SELECT ON radix.csp_services TO PUBLIC;
COMMENT ON FUNCTION radix.grant_service(text, name) IS
    'Allow documents whose RUN_AS has the privileges of GRANTEE (a role, or PUBLIC) to name CSP service SERVICE.';
COMMENT ON FUNCTION radix.revoke_service(text, name) IS
    'Withdraw a grant made by radix.grant_service; runs already admitted fail at their next start.';

-- ===== 0006_argument_limits.sql =====
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

-- ===== 0007_fair_claims.sql =====
-- 0007: fair claims. One principal's due work can no longer take every slot: a claim gives each principal
-- (the RUN AS role) at most `max_per_principal` running attempts in the database, counted across all
-- nodes, and shares the slots it has round-robin among the principals with due work: fewest running
-- first, then oldest due tick. Claims serialise on one radix-owned row (no other role can lock it), so
-- the count a claim decides on is exact.
--
-- Fairness is per principal, not per job owner: an owner may SET ROLE to each principal it schedules as,
-- and create jobs owned by that principal, so per-owner shares would give a tenant one share per role it
-- can become plus its own; per principal it gets one share per LOGIN role it may run as, and LOGIN roles
-- are made by whoever administers the cluster. See docs/security.md "Fair claims".

-- The principal of each state row, kept from radix.jobs (a job's principal never changes today; the
-- trigger on radix.jobs keeps it right if that ever does), so due work can be found per principal.
ALTER TABLE radix.radix_system_job_state ADD COLUMN principal_oid oid;
UPDATE radix.radix_system_job_state s SET principal_oid = j.principal_oid FROM radix.jobs j
WHERE j.job_id = s.job_id;
ALTER TABLE radix.radix_system_job_state ALTER COLUMN principal_oid SET NOT NULL;

CREATE FUNCTION radix._state_principal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.principal_oid := (SELECT j.principal_oid FROM radix.jobs j WHERE j.job_id = NEW.job_id);
    RETURN NEW;
END $$;
CREATE TRIGGER state_principal BEFORE INSERT OR UPDATE OF job_id ON radix.radix_system_job_state
    FOR EACH ROW EXECUTE FUNCTION radix._state_principal();

CREATE FUNCTION radix._job_principal_changed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE radix.radix_system_job_state SET principal_oid = NEW.principal_oid WHERE job_id = NEW.job_id;
    RETURN NULL;
END $$;
CREATE TRIGGER job_principal_changed AFTER UPDATE OF principal_oid ON radix.jobs
    FOR EACH ROW WHEN (OLD.principal_oid IS DISTINCT FROM NEW.principal_oid)
    EXECUTE FUNCTION radix._job_principal_changed();

-- Due work per principal, in due order: the claim reads each principal's earliest ticks from here, and
-- the distinct principals with live rows by a skip scan (two descents per principal).
CREATE INDEX radix_system_job_state_principal_due ON radix.radix_system_job_state (principal_oid, due_ns)
    WHERE status IN ('scheduled', 'running', 'retry_wait');

-- The row every claim locks first (FOR UPDATE): no ordinary role has a privilege on the table, so none
-- can lock it or hold a claim up.
CREATE TABLE radix.claim_serial (only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row));
INSERT INTO radix.claim_serial VALUES (true);
REVOKE ALL ON radix.claim_serial FROM PUBLIC;

-- The principals with live work: their earliest due tick (scheduled / retry_wait, or a running claim's
-- lease expiry) and how many attempts they have running in the database (every node). Cost: a skip scan
-- of radix_system_job_state_principal_due (two descents per principal) and the running rows
-- (radix_system_job_state_running); never the catalog.
CREATE FUNCTION radix._principal_load()
RETURNS TABLE (principal oid, first_due_ns bigint, running integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH RECURSIVE keys(p) AS (
        (SELECT s.principal_oid FROM radix.radix_system_job_state s
         WHERE s.status IN ('scheduled', 'running', 'retry_wait')
         ORDER BY s.principal_oid LIMIT 1)
        UNION ALL
        SELECT (SELECT s.principal_oid FROM radix.radix_system_job_state s
                WHERE s.status IN ('scheduled', 'running', 'retry_wait') AND s.principal_oid > k.p
                ORDER BY s.principal_oid LIMIT 1)
        FROM keys k WHERE k.p IS NOT NULL
    ), busy AS (
        SELECT s.principal_oid AS p, count(*)::integer AS n
        FROM radix.radix_system_job_state s WHERE s.status = 'running' GROUP BY s.principal_oid
    )
    SELECT k.p,
           (SELECT s.due_ns FROM radix.radix_system_job_state s
            WHERE s.status IN ('scheduled', 'running', 'retry_wait') AND s.principal_oid = k.p
            ORDER BY s.due_ns LIMIT 1),
           coalesce(b.n, 0)
    FROM keys k LEFT JOIN busy b ON b.p = k.p
    WHERE k.p IS NOT NULL
$$;

-- next_due_in: seconds until the earliest tick a claim with this cap could take (<= 0: now), or NULL
-- when there is none: a principal at its cap has nothing due until one of its attempts ends. While
-- nothing is due it is one probe of radix_system_job_state_due.
CREATE FUNCTION radix.next_due_in(max_per_principal integer) RETURNS float8
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    first bigint := (SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                     WHERE s.status IN ('scheduled', 'running', 'retry_wait'));
BEGIN
    IF first IS NULL OR first > now_ns OR coalesce(max_per_principal, 0) <= 0 THEN
        RETURN (first - now_ns) / 1e9;
    END IF;
    RETURN (SELECT (min(l.first_due_ns) - now_ns) / 1e9 FROM radix._principal_load() l
            WHERE l.running < max_per_principal);
END $$;

-- The round-robin of one claim: `budget` slots dealt one at a time, each to the principal with the
-- fewest running attempts (`running`, plus what this deal gave it), ties by its earliest due tick, never
-- past `cap` (NULL: no cap). Returns how many slots each principal got.
CREATE FUNCTION radix._claim_shares(principals oid[], running integer[], first_due bigint[],
                                    budget integer, cap integer)
RETURNS TABLE (principal oid, share integer)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT x.p, count(*)::integer
    FROM (SELECT u.p
          FROM unnest(principals, running, first_due) AS u(p, n, due)
          CROSS JOIN LATERAL generate_series(1, least(budget, coalesce(cap - u.n, budget))) AS g(i)
          ORDER BY u.n + g.i, u.due, u.p
          LIMIT greatest(budget, 0)) x
    GROUP BY x.p
$$;

-- claim_due: claim up to `max_claims` ticks for `node`. Claimable: the claims of dead nodes (running,
-- their node's control session gone), then due rows (scheduled / retry_wait with due_ns <= now, or
-- running with an expired lease); never a job with a committed frame whose backend still runs, and
-- never a row locked by a running atomic attempt (KEY SHARE) or another claimer (SKIP LOCKED).
-- Fair: the slots are dealt round-robin among the principals with due work (radix._claim_shares:
-- fewest running attempts first, then earliest due tick), each principal's rows in due order; a
-- principal with `max_per_principal` attempts running in the database (every node) gets none (NULL or
-- 0: no cap). A principal with fewer claimable rows than its share is done, and what is left of the
-- budget is dealt again among the others. Resumed claims of dead nodes already count as running.
-- Claims serialise on radix.claim_serial, so two nodes never both fill one cap.
-- With `with_cron` false, cron ticks are left alone (the engine plans them first, see planning.py).
-- Missed interval ticks coalesce to the latest due one (counted) when a fresh tick starts; a resumed
-- claim keeps its planned time, attempt number and idempotency key. Each claim writes the state and a
-- 'running' history row together.
-- Cost: index scans only. Nothing due: one probe of radix_system_job_state_due. Due work: a skip scan
-- over the principals with live rows (radix._principal_load), then per principal an ordered scan of
-- radix_system_job_state_principal_due that stops at its share; running rows by
-- radix_system_job_state_running; node liveness only when another node holds a running claim.
DROP FUNCTION radix.claim_due(text, integer, boolean);
CREATE FUNCTION radix.claim_due(node text, max_claims integer, with_cron boolean DEFAULT true,
                                max_per_principal integer DEFAULT NULL)
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
            lease_expires_at = now_ts + interval '5 minutes',
            due_ns = radix.to_ns(now_ts + interval '5 minutes'),
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

REVOKE ALL ON FUNCTION radix.claim_due(text, integer, boolean, integer), radix.next_due_in(integer),
    radix._principal_load(), radix._claim_shares(oid[], integer[], bigint[], integer, integer),
    radix._state_principal(), radix._job_principal_changed() FROM PUBLIC;

-- ===== 0008_locks_notify.sql =====
-- 0008: nothing radixjobs waits on can be held by an ordinary role, and a full notification queue
-- never fails a write (issue #11, items 5 and 6).
--
-- Locks. Advisory keys are one namespace per database that any connected role may take: a role holding
-- pg_advisory_lock(hashtext('radix.job:app.victim')) or the 'radix.doc:<NUM>' key stalled CREATE JOB and
-- document applies for everyone. Names are now serialised on rows of radix.name_locks, a table PUBLIC
-- has no privilege on: a row lock is only taken by executing a statement, and executing needs the
-- privilege (PREPARE and CREATE VIEW take TABLE locks without one: never use a table-level lock here).
-- Only a role that passed the same admission checks (CREATE on the job's schema; owning the document or
-- creating a new NUM) ever holds such a row, and then only for its own transaction. As a second line,
-- the lock waits of admission (the name; the document rows; the job row for DROP JOB) are bounded by
-- radix._bound_lock_wait (5 s, or the caller's smaller lock_timeout) and end in a one-line error naming
-- what was locked.
--
-- Notifications. NOTIFY hands its payload to a cluster-wide queue at COMMIT; a session that LISTENs and
-- then stays in a transaction stops the queue from draining, and once it is full every notifying COMMIT
-- fails ("too many notifications in the NOTIFY queue"). Wake-ups are hints (the schedulers also run on
-- timers), so radix._hint skips them while the queue is half full or more.

-- One row per job name ('job', quoted schema.name) or document NUM ('doc', NUM) ever admitted; its row lock
-- serialises admission of that name. Rows are kept (deleting one under a waiter would let two
-- admissions of the name through).
CREATE TABLE radix.name_locks (
    kind text NOT NULL CHECK (kind IN ('job', 'doc')),
    name text NOT NULL,
    PRIMARY KEY (kind, name)
);
REVOKE ALL ON radix.name_locks FROM PUBLIC;

-- Bound this transaction's lock waits: 5 s, or the caller's own lock_timeout when it is shorter.
-- Returns the setting to restore (set_config(..., true) with it) once the waits are over; an error
-- rolls the setting back with the transaction or savepoint.
CREATE FUNCTION radix._bound_lock_wait() RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    prior text := pg_catalog.current_setting('lock_timeout');
    prior_ms bigint := (SELECT s.setting::pg_catalog.int8 FROM pg_catalog.pg_settings s
                        WHERE s.name OPERATOR(pg_catalog.=) 'lock_timeout');
BEGIN
    IF prior_ms OPERATOR(pg_catalog.=) 0 OR prior_ms OPERATOR(pg_catalog.>) 5000 THEN
        PERFORM pg_catalog.set_config('lock_timeout', '5s', true);
    END IF;
    RETURN prior;
END $$;

-- Lock a name for admission until the end of the transaction (re-entrant within it); a wait past the
-- bound raises 55P03 with a one-line message.
CREATE FUNCTION radix._lock_name(kind text, name text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO radix.name_locks (kind, name) VALUES (_lock_name.kind, _lock_name.name)
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM radix.name_locks l
    WHERE l.kind OPERATOR(pg_catalog.=) _lock_name.kind AND l.name OPERATOR(pg_catalog.=) _lock_name.name
    FOR UPDATE;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION '% % is being created or changed by another transaction; try again',
        CASE kind WHEN 'job' THEN 'job' ELSE 'CRON_TABLE task' END, name
        USING ERRCODE = '55P03',
              HINT = 'Another session holds it in an open transaction (see pg_stat_activity).';
END $$;

-- A wake-up for the schedulers, skipped while the notification queue is half full or more: PostgreSQL
-- warns at that level too, and the other half is the margin against the queue filling between this
-- check and COMMIT. A skipped hint costs at most one poll period (serve --poll, the document check).
CREATE FUNCTION radix._hint(channel text, payload text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.pg_notification_queue_usage() OPERATOR(pg_catalog.<) 0.5 THEN
        PERFORM pg_catalog.pg_notify(channel, payload);
    END IF;
END $$;

REVOKE ALL ON FUNCTION radix._bound_lock_wait(), radix._lock_name(text, text) FROM PUBLIC;
-- radix._hint keeps PUBLIC's EXECUTE: it can do nothing pg_notify cannot, and the triggers below run it
-- as whichever role writes the documents.

-- -- replaced from 0002 ------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION radix._arm_state(j radix.jobs) RETURNS void
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
    PERFORM radix._hint('radix_jobs', j.job_id::text);
END $$;

-- The name is serialised on radix.name_locks (was: an advisory lock any role could hold).
CREATE OR REPLACE FUNCTION radix._check_admission(caller oid, job_parts text[], run_as text,
                                                  if_not_exists boolean)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_schema oid := (SELECT oid FROM pg_namespace WHERE nspname = job_parts[1]);
    principal pg_roles;
    existing uuid;
    prior_timeout text;
BEGIN
    IF job_schema IS NULL THEN
        RAISE EXCEPTION 'schema % does not exist', quote_ident(job_parts[1]) USING ERRCODE = '3F000';
    END IF;
    IF NOT has_schema_privilege(caller, job_schema, 'CREATE') THEN
        RAISE EXCEPTION 'permission denied for schema %', quote_ident(job_parts[1]) USING ERRCODE = '42501',
            HINT = 'Creating a job needs the CREATE privilege on its schema.';
    END IF;
    prior_timeout := radix._bound_lock_wait();
    PERFORM radix._lock_name('job', quote_ident(job_parts[1]) || '.' || quote_ident(job_parts[2]));
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
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

-- The wait for the job's row is bounded; the wake-up is a hint.
CREATE OR REPLACE FUNCTION radix._drop_job(creator name, job text, if_exists boolean, cascade boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    prior_timeout text := radix._bound_lock_wait();
    caller oid := radix._caller(creator);
    j radix.jobs;
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
    IF NOT cascade AND EXISTS (SELECT 1 FROM radix.radix_system_job_state
                               WHERE job_id = j.job_id AND lease_expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION 'cannot drop job %.%: an attempt is running', quote_ident(j.schema_name),
            quote_ident(j.job_name) USING ERRCODE = '55006',
            HINT = 'Wait for it to finish, or use DROP JOB ... CASCADE.';
    END IF;
    DELETE FROM radix.jobs WHERE job_id = j.job_id;
    PERFORM radix._hint('radix_jobs', j.job_id::text);
    RETURN true;
END $$;

-- -- replaced from 0004 ------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION radix._notify_document() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM radix._hint('radix_documents', OLD.num);
    ELSE
        PERFORM radix._hint('radix_documents', NEW.num);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION radix._notify_process() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM radix._hint('radix_documents', NEW.task_num);
    RETURN NULL;
END $$;

-- Every key is locked on radix.name_locks (was: advisory locks any role could hold), with bounded waits.
CREATE OR REPLACE FUNCTION radix._apply_documents(creator name, docs jsonb, single boolean) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    problems text[] := '{}';
    permission boolean := false;
    d record;
    a record;
    results jsonb := '[]';
    prior_timeout text;
BEGIN
    IF jsonb_typeof(docs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'documents must be a JSON object or a list of objects' USING ERRCODE = '22023';
    END IF;
    FOR d IN SELECT e, n::integer AS n FROM jsonb_array_elements(docs) WITH ORDINALITY AS x(e, n) LOOP
        problems := problems || ARRAY(SELECT radix._doc_prefix(d.e, d.n, single) || m
                                      FROM unnest(radix.document_problems(d.e)) m);
    END LOOP;
    problems := problems || ARRAY(
        SELECT format('NUM %s appears more than once (documents %s)', k,
                      array_to_string(array_agg(n ORDER BY n), ', '))
        FROM (SELECT radix.document_num(e) AS k, n FROM jsonb_array_elements(docs) WITH ORDINALITY AS x(e, n)) s
        WHERE k IS NOT NULL GROUP BY k HAVING count(*) > 1 ORDER BY min(n));
    IF cardinality(problems) = 0 THEN
        prior_timeout := radix._bound_lock_wait();
        -- lock every key in one order (concurrent lists cannot deadlock), then check access
        PERFORM radix._lock_name('doc', k)
        FROM (SELECT radix.document_num(e) AS k FROM jsonb_array_elements(docs) e
              ORDER BY radix.document_num(e) COLLATE "C") s;
        FOR d IN SELECT e, n::integer AS n FROM jsonb_array_elements(docs) WITH ORDINALITY AS x(e, n) LOOP
            FOR a IN SELECT * FROM radix._doc_access_problems(caller, d.e) LOOP
                problems := problems || (radix._doc_prefix(d.e, d.n, single) || a.problem);
                permission := permission OR a.permission;
            END LOOP;
        END LOOP;
    END IF;
    IF cardinality(problems) > 0 THEN
        RAISE EXCEPTION '%', CASE WHEN cardinality(problems) = 1 THEN 'CRON_TABLE document rejected: ' || problems[1]
                                  ELSE format('CRON_TABLE document rejected: %s problems', cardinality(problems)) END
            USING ERRCODE = CASE WHEN permission THEN '42501' ELSE '22023' END,
                  DETAIL = array_to_string(problems, E'\n');
    END IF;
    BEGIN
        FOR d IN SELECT e FROM jsonb_array_elements(docs) e LOOP
            results := results || radix._doc_write(caller, d.e);
        END LOOP;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'CRON_TABLE task % is being changed by another transaction; try again',
            radix.document_num(d.e) USING ERRCODE = '55P03',
            HINT = 'The scheduler or another session holds it (see pg_stat_activity).';
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    RETURN results;
END $$;

-- ===== 0009_roles.sql =====
-- 0009: every role can use the CLI, and the operator's view (issue #12, section 1).
--
-- Version. radix.schema_migrations stays readable only by the installer; radix.schema_version() reads it
-- for anyone (SECURITY DEFINER, search_path pinned), so every LOGIN role's `radixjobs` command and the
-- daemon can check the schema version. Clients probe for the function first (to_regprocedure): on a
-- database without radix, or one older than 0009, it does not exist.
--
-- The operator's view. A role is an operator of a database when it is a superuser, has the privileges
-- (pg_has_role USAGE: itself, or membership with INHERIT) of the owner of schema radix (the scheduler's
-- role), or of the cluster role radix_admin. Operators see every job, document, attempt and node in the
-- views (radix.job_overview, radix.job_history, radix.document_overview, radix.document_processes,
-- radix.node_overview) and so in the CLI. Seeing is all: altering or dropping a job or document still
-- needs its owner's privileges. radix_admin is created here (NOLOGIN) when missing and the installer may
-- create roles; otherwise a NOTICE says how the operator creates it. Role names are cluster-wide, so the
-- role may exist already (another database's install made it, or the operator did).

CREATE FUNCTION radix.schema_version() RETURNS integer
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN (SELECT max(version) FROM radix.schema_migrations);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'radix_admin') THEN
        RETURN;
    ELSIF NOT (SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user) THEN
        RAISE NOTICE 'role radix_admin was not created: role % may not create roles. The operator creates it '
                     'once per cluster: CREATE ROLE radix_admin NOLOGIN; then GRANT radix_admin TO <role>',
                     quote_ident(current_user);
        RETURN;
    END IF;
    BEGIN
        CREATE ROLE radix_admin NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- an install in another database of the cluster created it first
    END;
END $$;

-- Is the current role an operator of this database (see above)? A radix_admin created after the install
-- counts as well (looked up by name at every call).
CREATE FUNCTION radix._is_operator() RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)
    OR pg_has_role(current_user, (SELECT nspowner FROM pg_namespace WHERE nspname = 'radix'), 'USAGE')
    OR coalesce((SELECT pg_has_role(current_user, r.oid, 'USAGE') FROM pg_roles r
                 WHERE r.rolname = 'radix_admin'), false);

-- Whether the current role sees a job or document owned by `owner`: it is an operator, or it has the
-- owner's privileges. The job and document views call this.
CREATE OR REPLACE FUNCTION radix._owner_visible(owner oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN radix._is_operator() THEN true
            WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE oid = owner) THEN false
            ELSE pg_has_role(current_user, owner, 'USAGE') END;

-- Liveness of a node, for the views of operators (radix.nodes is the scheduler's only; another user's
-- backend start time is hidden from pg_stat_activity). Says no more than whether a named node runs.
CREATE FUNCTION radix.node_is_alive(node text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN radix.node_alive(node);

-- How many scheduler nodes are alive in this database (for `radixjobs status`; a count only).
CREATE FUNCTION radix.live_node_count() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- a node is a scheduler process (host and pid): a daemon's engine and document scheduler (X, X:docs) count once
RETURN (SELECT count(DISTINCT coalesce(n.hostname || ':' || n.pid, n.node_id)) FROM radix.nodes n
        WHERE radix.node_alive(n.node_id));

-- The scheduler nodes, to operators only.
CREATE VIEW radix.node_overview WITH (security_barrier) AS
SELECT n.node_id, n.hostname, n.pid, n.started_at, n.last_seen, radix.node_is_alive(n.node_id) AS alive
FROM radix.nodes n
WHERE radix._is_operator();

GRANT EXECUTE ON FUNCTION radix.schema_version(), radix._is_operator(), radix._owner_visible(oid),
    radix.node_is_alive(text), radix.live_node_count() TO PUBLIC;
GRANT SELECT ON radix.node_overview TO PUBLIC;
COMMENT ON FUNCTION radix.schema_version() IS
    'The installed radix schema version (the newest applied migration), readable by every role.';
COMMENT ON VIEW radix.node_overview IS
    'Scheduler nodes of this database; rows only for operators (superusers, the radix schema owner, radix_admin).';

-- ===== 0010_lease_options.sql =====
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

-- ===== 0011_lifecycle.sql =====
-- 0011: change a job without losing it (issue #13): RUN JOB, backfill, ALTER JOB ... SET / RESET /
-- RENAME, CREATE OR REPLACE JOB, and the options max_attempts, history, coalesce and time_zone.
--
-- Requests. RUN JOB and RUN JOB ... FOR RANGE queue extra ticks in radix.job_requests, each with its own
-- planned time (RUN JOB: the moment of the request; a backfill: a tick of the schedule) and therefore its
-- own idempotency key. A request becomes the job's current tick only while the job is idle (its state
-- neither running nor waiting to retry): the regular state is stashed in the state row
-- (radix_system_job_state.stash), the request's tick is installed with request_kind set, and when its
-- attempts end (success, or a terminal failure) the stash is put back and the next request, if any, is
-- installed. So a request never overlaps an attempt of the same job: it waits its turn, and it is
-- claimed, run, retried, fenced and recorded exactly as a scheduled tick is (the claim never coalesces a
-- request's tick). Requests run on a disabled job too. ALTER JOB ... DISABLE drops every queued request
-- (it stops a backfill); any other re-arm puts the request in flight back in the queue.
--
-- Backfill ticks that succeeded are recorded in radix.backfill_done in the attempt's own transaction
-- (atomic jobs: with the procedure's effects), so a repeated backfill skips them even after their
-- history rows were pruned; scheduled ticks count as done while their succeeded history row is kept.
--
-- Re-arming. A change of schedule, principal, call, timeout, coalesce or time zone (ALTER JOB ... SET,
-- CREATE OR REPLACE JOB, ENABLE/DISABLE) re-arms the state as ENABLE did: an attempt running under the
-- old definition is fenced out (its lease token is gone: an atomic attempt rolls back, a non-atomic one
-- keeps what it committed and is ended at its node's next lease renewal), and the next attempt cannot
-- start until its backend has ended (the claim skips a job with a live frame or a locked row). An EVERY
-- job keeps its grid anchor unless its STARTING AT changes. RENAME and SET (history | max_attempts)
-- change nothing about how an attempt runs: they bump definition_version and leave a running attempt be.
--
-- Fence. An atomic attempt's frame is not visible to other transactions before it commits, and the row
-- lock it holds is on the state row's old version once a re-arm updated it; so a re-arm records the
-- fenced attempt (fence_node, fence_token) and the claim skips the job while that node is alive, until
-- the node reports the attempt's end (radix.finish_attempt with the old token clears the fence).

-- -- storage -------------------------------------------------------------------------------------------

ALTER TABLE radix.jobs
    ADD COLUMN max_attempts integer NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 10),
    ADD COLUMN history_limit integer NOT NULL DEFAULT 256 CHECK (history_limit BETWEEN 1 AND 100000),
    ADD COLUMN coalesce_ticks boolean NOT NULL DEFAULT true;

ALTER TABLE radix.radix_system_job_state
    ADD COLUMN request_kind text CHECK (request_kind IN ('run', 'backfill')),
    ADD COLUMN stash jsonb,
    ADD COLUMN fence_node text,
    ADD COLUMN fence_token uuid,
    ADD CHECK ((request_kind IS NULL) = (stash IS NULL));

ALTER TABLE radix.radix_system_job_history
    ADD COLUMN run_kind text NOT NULL DEFAULT 'schedule' CHECK (run_kind IN ('schedule', 'run', 'backfill'));

CREATE TABLE radix.job_requests (
    job_id       uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    planned_ns   bigint NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('run', 'backfill')),
    requested_by name NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, planned_ns)
);

CREATE TABLE radix.backfill_done (
    job_id     uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    planned_ns bigint NOT NULL,
    PRIMARY KEY (job_id, planned_ns)
);
REVOKE ALL ON radix.job_requests, radix.backfill_done FROM PUBLIC;

-- -- limits --------------------------------------------------------------------------------------------

CREATE FUNCTION radix.max_requested_ticks() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 10000;
COMMENT ON FUNCTION radix.max_requested_ticks() IS
    'radixjobs: the most ticks one RUN JOB ... FOR RANGE may queue, and the most requests a job may have queued';
CREATE FUNCTION radix.max_missed_ticks() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1000;
COMMENT ON FUNCTION radix.max_missed_ticks() IS
    'radixjobs: with coalesce = off, at most this many missed ticks of a job are run (the newest ones)';
GRANT EXECUTE ON FUNCTION radix.max_requested_ticks(), radix.max_missed_ticks() TO PUBLIC;

-- -- options -------------------------------------------------------------------------------------------

-- WITH (...) / SET (...) options as given (JSON: {"timeout": "2 hours", "max_attempts": 3, "history":
-- 1000, "coalesce": "off", "time_zone": "Europe/Berlin"}) -> their stored form {deadline_ms, max_attempts,
-- history_limit, coalesce_ticks, time_zone}; raises naming the option for anything else. Runs on the
-- caller's side (an interval is read in the caller's session, like a constant).
CREATE FUNCTION radix._normalise_options(opts jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
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
        WHEN 'coalesce' THEN
            IF lower(t) NOT IN ('on', 'off', 'true', 'false', 'yes', 'no', '1', '0') THEN
                RAISE EXCEPTION 'option coalesce must be on or off, not %', t USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object('coalesce_ticks', lower(t) IN ('on', 'true', 'yes', '1'));
        WHEN 'time_zone' THEN
            IF NOT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = t) THEN
                RAISE EXCEPTION 'option time_zone: unknown time zone %', quote_literal(t) USING ERRCODE = '22023';
            END IF;
            out := out || jsonb_build_object('time_zone', t);
        ELSE
            RAISE EXCEPTION 'unknown option "%" (accepted: timeout, max_attempts, history, coalesce, time_zone)', k
                USING ERRCODE = '22023';
        END CASE;
    END LOOP;
    RETURN out;
END $$;
GRANT EXECUTE ON FUNCTION radix._normalise_options(jsonb) TO PUBLIC;

-- Apply normalised options (and RESET names) to a job row; time_zone applies to CRON schedules only.
CREATE FUNCTION radix._with_options(j radix.jobs, opts jsonb, reset text[]) RETURNS radix.jobs
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY coalesce(reset, '{}') LOOP
        CASE r
        WHEN 'timeout' THEN j.deadline_ms := 240000;
        WHEN 'max_attempts' THEN j.max_attempts := 5;
        WHEN 'history' THEN j.history_limit := 256;
        WHEN 'coalesce' THEN j.coalesce_ticks := true;
        WHEN 'time_zone' THEN
            IF j.schedule_kind = 'cron' THEN j.cron_time_zone := 'UTC'; END IF;
        ELSE
            RAISE EXCEPTION 'unknown option "%" (accepted: timeout, max_attempts, history, coalesce, time_zone)', r
                USING ERRCODE = '22023';
        END CASE;
    END LOOP;
    opts := coalesce(opts, '{}');
    j.deadline_ms := coalesce((opts->>'deadline_ms')::integer, j.deadline_ms);
    j.max_attempts := coalesce((opts->>'max_attempts')::integer, j.max_attempts);
    j.history_limit := coalesce((opts->>'history_limit')::integer, j.history_limit);
    j.coalesce_ticks := coalesce((opts->>'coalesce_ticks')::boolean, j.coalesce_ticks);
    IF opts ? 'time_zone' THEN
        IF j.schedule_kind <> 'cron' THEN
            RAISE EXCEPTION 'option time_zone applies to CRON schedules only' USING ERRCODE = '22023';
        END IF;
        j.cron_time_zone := opts->>'time_zone';
    END IF;
    RETURN j;
END $$;

-- A job row with a (normalised) schedule.
CREATE FUNCTION radix._with_schedule(j radix.jobs, sched jsonb) RETURNS radix.jobs
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    j.schedule_kind := sched->>'kind';
    j.interval_ns := (sched->>'interval_ns')::bigint;
    j.starting_at_ns := (sched->>'starting_at_ns')::bigint;
    j.at_ns := (sched->>'at_ns')::bigint;
    j.cron_expression := sched->>'cron_expression';
    j.cron_time_zone := sched->>'cron_time_zone';
    RETURN j;
END $$;

-- The principal checks of CREATE JOB, for a principal named at ALTER / REPLACE: it exists, `caller` and
-- the job's owner may act as it (the SET rule), it can log in and use PL/pgSQL.
CREATE FUNCTION radix._check_principal(caller oid, owner oid, run_as text) RETURNS pg_roles
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    principal pg_roles;
BEGIN
    SELECT * INTO principal FROM pg_roles WHERE rolname = run_as;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role % does not exist', quote_ident(run_as) USING ERRCODE = '42704';
    END IF;
    IF NOT radix.may_act_as(caller, principal.oid) OR NOT radix.may_act_as(owner, principal.oid) THEN
        RAISE EXCEPTION 'permission denied to schedule a job as role %', quote_ident(run_as)
            USING ERRCODE = '42501',
                  HINT = 'The caller and the job''s owner must be able to SET ROLE to the principal '
                         '(GRANT ... WITH SET TRUE); only superusers may name a superuser.';
    END IF;
    IF NOT principal.rolcanlogin THEN
        RAISE EXCEPTION 'role % cannot log in', quote_ident(run_as) USING ERRCODE = '42501',
            HINT = format('Jobs run on a connection logged in as their principal: ALTER ROLE %s LOGIN.',
                          quote_ident(run_as));
    END IF;
    IF NOT has_language_privilege(principal.oid, 'plpgsql', 'USAGE') THEN
        RAISE EXCEPTION 'role % cannot use PL/pgSQL, which runs its jobs', quote_ident(run_as)
            USING ERRCODE = '42501', HINT = format('GRANT USAGE ON LANGUAGE plpgsql TO %s', quote_ident(run_as));
    END IF;
    RETURN principal;
END $$;

-- The job named `job`, locked for a change (the wait bounded, one-line errors), and its owner checked
-- against `caller`. A running atomic attempt does not hold the lock this takes (NO KEY UPDATE).
CREATE FUNCTION radix._job_for_change(caller oid, job text) RETURNS radix.jobs
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    prior_timeout text := radix._bound_lock_wait();
    j radix.jobs;
BEGIN
    BEGIN
        j := radix._find_job(job);
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'job % is being changed by another transaction; try again', job USING ERRCODE = '55P03';
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    IF j.job_id IS NULL THEN
        RAISE EXCEPTION 'job % does not exist', job USING ERRCODE = '42704';
    END IF;
    PERFORM radix._check_job_owner(j, caller);
    RETURN j;
END $$;

-- -- requests ------------------------------------------------------------------------------------------

-- Install the oldest queued request as the job's current tick when the job is idle; true when it did.
CREATE FUNCTION radix._promote_request(job uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s radix.radix_system_job_state;
    r radix.job_requests;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = job) THEN
        RETURN false;
    END IF;
    SELECT * INTO s FROM radix.radix_system_job_state WHERE job_id = job;
    IF NOT FOUND OR s.status IN ('running', 'retry_wait') OR s.request_kind IS NOT NULL THEN
        RETURN false;
    END IF;
    DELETE FROM radix.job_requests q
    WHERE (q.job_id, q.planned_ns) = (SELECT o.job_id, o.planned_ns FROM radix.job_requests o
                                      WHERE o.job_id = job ORDER BY o.planned_ns LIMIT 1)
    RETURNING * INTO r;
    UPDATE radix.radix_system_job_state SET
        stash = jsonb_build_object('status', s.status, 'planned_ns', s.planned_ns, 'due_ns', s.due_ns,
                                   'attempt', s.attempt, 'idempotency_key', s.idempotency_key,
                                   'last_error', s.last_error),
        request_kind = r.kind, status = 'scheduled', planned_ns = r.planned_ns,
        due_ns = radix.to_ns(clock_timestamp()), attempt = 0, idempotency_key = NULL,
        updated_at = clock_timestamp()
    WHERE job_id = job;
    PERFORM radix._hint('radix_jobs', job::text);
    RETURN true;
END $$;

-- As 0003, and a request's tick ends by putting the stashed regular state back (a backfill tick that
-- succeeded is recorded in radix.backfill_done first); then the next queued request, if any, is installed.
CREATE OR REPLACE FUNCTION radix._advance(job uuid, token uuid, next_planned_ns bigint, succeeded boolean,
                                          error jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind text := (SELECT schedule_kind FROM radix.jobs WHERE job_id = job);
    s radix.radix_system_job_state;
BEGIN
    SELECT * INTO s FROM radix.radix_system_job_state
    WHERE job_id = job AND lease_token = token AND status = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF s.request_kind IS NOT NULL THEN
        IF succeeded AND s.request_kind = 'backfill' THEN
            INSERT INTO radix.backfill_done (job_id, planned_ns) VALUES (job, s.planned_ns) ON CONFLICT DO NOTHING;
        END IF;
        UPDATE radix.radix_system_job_state SET
            status = s.stash->>'status', planned_ns = (s.stash->>'planned_ns')::bigint,
            due_ns = (s.stash->>'due_ns')::bigint, attempt = (s.stash->>'attempt')::integer,
            idempotency_key = s.stash->>'idempotency_key',
            last_error = CASE WHEN succeeded THEN s.stash->'last_error' ELSE coalesce(error, s.last_error) END,
            request_kind = NULL, stash = NULL,
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = clock_timestamp()
        WHERE job_id = job AND lease_token = token AND status = 'running';
    ELSE
        UPDATE radix.radix_system_job_state SET
            status = CASE WHEN kind = 'at' OR next_planned_ns IS NULL
                          THEN CASE WHEN succeeded THEN 'complete' ELSE 'failed' END
                          ELSE 'scheduled' END,
            planned_ns = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN planned_ns ELSE next_planned_ns END,
            due_ns = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN NULL ELSE next_planned_ns END,
            attempt = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN attempt ELSE 0 END,
            idempotency_key = CASE WHEN kind = 'at' OR next_planned_ns IS NULL THEN idempotency_key END,
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL,
            last_error = coalesce(error, CASE WHEN succeeded THEN NULL ELSE last_error END),
            updated_at = clock_timestamp()
        WHERE job_id = job AND lease_token = token AND status = 'running';
    END IF;
    IF NOT FOUND THEN  -- re-armed or taken over since the read above (the token is the fence)
        RETURN false;
    END IF;
    PERFORM radix._promote_request(job);
    RETURN true;
END $$;

-- RUN JOB / RUN JOB ... FOR RANGE: queue `ticks` (planned times, ns) as requests of `kind`; the same
-- rights as ALTER JOB. Ticks already queued, the job's current tick (which will run anyway), or done (a
-- succeeded attempt in the history, or a backfill tick recorded done) are skipped. Returns the ticks queued.
CREATE FUNCTION radix._request_ticks(creator name, job text, ticks bigint[], kind text) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    j radix.jobs := radix._job_for_change(caller, job);
    s radix.radix_system_job_state;
    queued bigint[];
BEGIN
    IF cardinality(ticks) > radix.max_requested_ticks() THEN
        RAISE EXCEPTION 'RUN JOB would queue % ticks, above the limit of % per statement', cardinality(ticks),
            radix.max_requested_ticks() USING ERRCODE = '54000', HINT = 'Split the range.';
    END IF;
    SELECT * INTO s FROM radix.radix_system_job_state WHERE job_id = j.job_id;
    queued := ARRAY(
        SELECT DISTINCT t FROM unnest(ticks) AS t
        WHERE t IS NOT NULL
          -- the job's current tick (scheduled, running or retrying, a request's or the stashed regular one)
          AND NOT coalesce(s.status IN ('scheduled', 'running', 'retry_wait') AND s.planned_ns = t, false)
          AND NOT coalesce(s.stash->>'status' IN ('scheduled', 'running', 'retry_wait')
                           AND (s.stash->>'planned_ns')::bigint = t, false)
          AND NOT EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = j.job_id AND q.planned_ns = t)
          AND NOT (kind = 'backfill' AND (
                   EXISTS (SELECT 1 FROM radix.backfill_done d WHERE d.job_id = j.job_id AND d.planned_ns = t)
                   OR EXISTS (SELECT 1 FROM radix.radix_system_job_history h
                              WHERE h.job_id = j.job_id AND h.planned_ns = t AND h.status = 'succeeded')))
        ORDER BY t);
    IF (SELECT count(*) FROM radix.job_requests q WHERE q.job_id = j.job_id) + cardinality(queued)
       > radix.max_requested_ticks() THEN
        RAISE EXCEPTION 'job % has too many queued runs (at most %)', job, radix.max_requested_ticks()
            USING ERRCODE = '54000', HINT = 'Wait for them to run, or ALTER JOB ... DISABLE to drop them.';
    END IF;
    INSERT INTO radix.job_requests (job_id, planned_ns, kind, requested_by)
    SELECT j.job_id, t, kind, (SELECT rolname FROM pg_roles WHERE oid = caller) FROM unnest(queued) AS t;
    PERFORM radix._promote_request(j.job_id);
    RETURN queued;
END $$;

-- RUN JOB name: one extra attempt now; returns its idempotency key (<job-id>/<planned-ns>).
CREATE FUNCTION radix.run_job(job text) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    parts text[] := radix._split_qualified(job, 'job');
    queued bigint[] := radix._request_ticks(current_user, job, ARRAY[radix.to_ns(clock_timestamp())], 'run');
BEGIN
    IF cardinality(queued) = 0 THEN  -- the same nanosecond twice
        RAISE EXCEPTION 'a run of job % was just requested; try again', job USING ERRCODE = '55006';
    END IF;
    RETURN (SELECT o.job_id FROM radix.job_overview o
            WHERE o.schema_name = parts[1] AND o.job_name = parts[2])::text || '/' || queued[1]::text;
END $$;

-- RUN JOB name FOR RANGE a TO b: every tick of the schedule in [a, b), and not after now, that has not
-- succeeded. EVERY and AT ticks are computed here; the database cannot evaluate cron, so for a CRON job
-- the caller passes the ticks (radixjobs computes them with the scheduler's own cron code) and they are
-- checked to lie in the range. Returns how many ticks were queued.
CREATE FUNCTION radix.backfill_job(job text, from_time timestamptz, to_time timestamptz,
                                   cron_ticks bigint[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
    SELECT o.job_id, o.schedule_kind, o.interval_ns, o.at_ns, radix.job_anchor_ns(o.job_id) AS anchor_ns INTO j
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

-- The grid anchor of a job the caller sees (for backfill's EVERY ticks); NULL otherwise.
CREATE FUNCTION radix.job_anchor_ns(job uuid) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN (SELECT s.anchor_ns FROM radix.radix_system_job_state s JOIN radix.jobs j USING (job_id)
        WHERE s.job_id = job AND radix._owner_visible(j.owner_oid));

GRANT EXECUTE ON FUNCTION radix.run_job(text), radix.backfill_job(text, timestamptz, timestamptz, bigint[]),
    radix.job_anchor_ns(uuid), radix._request_ticks(name, text, bigint[], text) TO PUBLIC;

-- -- re-arming -----------------------------------------------------------------------------------------

-- As _arm_state (0010), and: `keep_anchor` keeps an EVERY job's grid anchor (ALTER ... SET, CREATE OR
-- REPLACE) unless STARTING AT gives one; a completed one-time job stays complete only for the same AT
-- time; DISABLE drops the queued requests, any other re-arm puts a request in flight back in the queue.
CREATE FUNCTION radix._rearm(j radix.jobs, keep_anchor boolean) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    old radix.radix_system_job_state;
    anchor bigint;
    planned bigint;
    done boolean := false;
    new_status text := CASE WHEN j.enabled THEN 'scheduled' ELSE 'disabled' END;
BEGIN
    SELECT * INTO old FROM radix.radix_system_job_state WHERE job_id = j.job_id;
    anchor := coalesce(j.starting_at_ns, CASE WHEN keep_anchor THEN old.anchor_ns END, now_ns);
    IF j.schedule_kind = 'every' THEN
        planned := anchor + j.interval_ns * greatest(1, (greatest(now_ns - anchor, 0) / j.interval_ns) + 1);
    ELSIF j.schedule_kind = 'at' THEN
        planned := j.at_ns;
        done := (coalesce(old.stash->>'status', old.status) = 'complete'
                 AND coalesce((old.stash->>'planned_ns')::bigint, old.planned_ns) = j.at_ns)
             OR EXISTS (SELECT 1 FROM radix.radix_system_job_history h
                        WHERE h.job_id = j.job_id AND h.planned_ns = j.at_ns AND h.status = 'succeeded'
                          AND h.run_kind = 'schedule');
        IF done THEN
            new_status := 'complete';
        END IF;
    END IF;
    IF NOT j.enabled THEN
        DELETE FROM radix.job_requests WHERE job_id = j.job_id;
    ELSIF old.request_kind IS NOT NULL THEN
        INSERT INTO radix.job_requests (job_id, planned_ns, kind, requested_by)
        VALUES (j.job_id, old.planned_ns, old.request_kind, j.owner_name) ON CONFLICT DO NOTHING;
    END IF;
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
        error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                                   'category', 'connection',
                                   'detail', jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = j.job_id AND h.status = 'running';
    UPDATE radix.radix_system_job_state SET
        definition_version = j.definition_version, status = new_status,
        anchor_ns = anchor, planned_ns = planned,
        due_ns = CASE WHEN new_status = 'scheduled' THEN coalesce(planned, now_ns) END,
        attempt = 0,
        idempotency_key = CASE WHEN done THEN j.job_id::text || '/' || j.at_ns::text END,
        lease_node = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = CASE WHEN done THEN last_error END,
        request_kind = NULL, stash = NULL,
        fence_node = CASE WHEN old.status = 'running' THEN old.lease_node ELSE old.fence_node END,
        fence_token = CASE WHEN old.status = 'running' THEN old.lease_token ELSE old.fence_token END,
        updated_at = clock_timestamp()
    WHERE job_id = j.job_id;
    IF NOT FOUND THEN
        INSERT INTO radix.radix_system_job_state
            (job_id, definition_version, status, anchor_ns, planned_ns, due_ns, attempt)
        VALUES (j.job_id, j.definition_version, new_status, anchor, planned,
                CASE WHEN new_status = 'scheduled' THEN coalesce(planned, now_ns) END, 0);
    END IF;
    PERFORM radix._promote_request(j.job_id);
    PERFORM radix._hint('radix_jobs', j.job_id::text);
END $$;

CREATE OR REPLACE FUNCTION radix._arm_state(j radix.jobs) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT radix._rearm(j, false);
END;

-- -- ALTER JOB ... SET / RESET / RENAME, CREATE OR REPLACE JOB -----------------------------------------

-- Change a job: each argument that is not NULL is a change, admitted as CREATE JOB admits it (a new
-- principal: the SET rule for the caller and the owner; a new call: `binding`, resolved on the caller's
-- side, checked against the catalog; a new name: CREATE on its schema). Options: `reset` names go back to
-- their defaults, then the schedule is set, then `opts` (normalised) apply. Returns false when nothing
-- changed; otherwise definition_version is bumped, and the state re-armed unless only the name, history
-- or max_attempts changed.
CREATE FUNCTION radix._change_job(creator name, job text, enabled boolean, schedule jsonb, run_as text,
                                  procedure text, binding jsonb, opts jsonb, reset text[], rename_to text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller oid := radix._caller(creator);
    j radix.jobs := radix._job_for_change(caller, job);
    prior_timeout text;
    n radix.jobs;
    parts text[];
    principal pg_roles;
    bound jsonb;
    quiet boolean;
BEGIN
    n := radix._with_options(j, NULL, reset);
    IF rename_to IS NOT NULL THEN
        parts := radix._split_qualified(rename_to, 'job');
        IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = parts[1]) THEN
            RAISE EXCEPTION 'schema % does not exist', quote_ident(parts[1]) USING ERRCODE = '3F000';
        END IF;
        IF NOT has_schema_privilege(caller, (SELECT oid FROM pg_namespace WHERE nspname = parts[1]), 'CREATE') THEN
            RAISE EXCEPTION 'permission denied for schema %', quote_ident(parts[1]) USING ERRCODE = '42501',
                HINT = 'Renaming a job needs the CREATE privilege on its new schema.';
        END IF;
        PERFORM radix._lock_name('job', quote_ident(parts[1]) || '.' || quote_ident(parts[2]));
        IF EXISTS (SELECT 1 FROM radix.jobs x WHERE x.schema_name = parts[1] AND x.job_name = parts[2]
                   AND x.job_id <> j.job_id) THEN
            RAISE EXCEPTION 'job %.% already exists', quote_ident(parts[1]), quote_ident(parts[2])
                USING ERRCODE = '42710';
        END IF;
        n.schema_name := parts[1];
        n.job_name := parts[2];
    END IF;
    IF schedule IS NOT NULL THEN
        IF schedule ? 'time_zone' AND opts ? 'time_zone' THEN
            RAISE EXCEPTION 'the time zone is given twice (TIME ZONE and time_zone)' USING ERRCODE = '22023';
        END IF;
        n := radix._with_schedule(n, radix._normalise_schedule(schedule));
    END IF;
    n := radix._with_options(n, opts, NULL);
    IF run_as IS NOT NULL THEN
        principal := radix._check_principal(caller, j.owner_oid, run_as);
        n.principal_oid := principal.oid;
        n.principal_name := principal.rolname;
    END IF;
    IF binding IS NOT NULL THEN
        parts := radix._split_qualified(procedure, 'procedure');
        bound := radix._check_binding(parts[1], parts[2], binding);
        n.procedure_oid := (bound->>'procedure_oid')::oid;
        n.procedure_signature := bound->>'signature';
        n.arguments := bound->'arguments';
        n.non_atomic := false;  -- detected again by the new procedure's first attempt
    END IF;
    IF enabled IS NOT NULL THEN
        n.enabled := enabled;
    END IF;
    IF n IS NOT DISTINCT FROM j THEN
        RETURN false;
    END IF;
    quiet := (n.schema_name, n.job_name, n.history_limit, n.max_attempts) IS DISTINCT FROM
             (j.schema_name, j.job_name, j.history_limit, j.max_attempts)
         AND (n.principal_oid, n.procedure_oid, n.procedure_signature, n.arguments, n.schedule_kind, n.interval_ns,
              n.starting_at_ns, n.at_ns, n.cron_expression, n.cron_time_zone, n.enabled, n.deadline_ms,
              n.coalesce_ticks)
             IS NOT DISTINCT FROM
             (j.principal_oid, j.procedure_oid, j.procedure_signature, j.arguments, j.schedule_kind, j.interval_ns,
              j.starting_at_ns, j.at_ns, j.cron_expression, j.cron_time_zone, j.enabled, j.deadline_ms,
              j.coalesce_ticks);
    prior_timeout := radix._bound_lock_wait();
    BEGIN
        UPDATE radix.jobs SET schema_name = n.schema_name, job_name = n.job_name,
            principal_oid = n.principal_oid, principal_name = n.principal_name,
            procedure_oid = n.procedure_oid, procedure_signature = n.procedure_signature, arguments = n.arguments,
            schedule_kind = n.schedule_kind, interval_ns = n.interval_ns, starting_at_ns = n.starting_at_ns,
            at_ns = n.at_ns, cron_expression = n.cron_expression, cron_time_zone = n.cron_time_zone,
            enabled = n.enabled, deadline_ms = n.deadline_ms, max_attempts = n.max_attempts,
            history_limit = n.history_limit, coalesce_ticks = n.coalesce_ticks, non_atomic = n.non_atomic,
            definition_version = j.definition_version + 1
        WHERE job_id = j.job_id RETURNING * INTO n;
    EXCEPTION WHEN lock_not_available THEN
        -- a new name changes a key column: that waits for a running atomic attempt (its KEY SHARE lock)
        RAISE EXCEPTION 'job % is running an attempt that holds it; try again when it ends', job
            USING ERRCODE = '55P03';
    END;
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    IF quiet THEN
        UPDATE radix.radix_system_job_state SET definition_version = n.definition_version WHERE job_id = n.job_id;
    ELSE
        PERFORM radix._rearm(n, j.enabled AND n.enabled
                                AND n.starting_at_ns IS NOT DISTINCT FROM j.starting_at_ns);
    END IF;
    PERFORM radix._hint('radix_jobs', n.job_id::text);
    RETURN true;
END $$;

-- Public entry point of ALTER JOB: ENABLE/DISABLE (`enabled`), SET SCHEDULE (`schedule`, as create_job
-- takes it), SET RUN AS (`run_as`), SET CALL (`procedure` with `arguments`, resolved here with the
-- caller's rights as CREATE JOB resolves them), SET (...) (`options`), RESET (...) (`reset`), RENAME TO
-- (`rename_to`). Returns true when the job changed. Signature changed from 0002: dropped and created again.
DROP FUNCTION radix.alter_job(text, boolean);
CREATE FUNCTION radix.alter_job(job text, enabled boolean DEFAULT NULL, schedule jsonb DEFAULT NULL,
                                run_as text DEFAULT NULL, procedure text DEFAULT NULL,
                                arguments jsonb DEFAULT NULL, options jsonb DEFAULT NULL,
                                reset text[] DEFAULT NULL, rename_to text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    args jsonb := radix._normalise_arguments(coalesce(arguments, '[]'));
    proc_parts text[];
BEGIN
    IF arguments IS NOT NULL AND procedure IS NULL THEN
        RAISE EXCEPTION 'arguments are changed with the procedure (SET CALL)' USING ERRCODE = '22023';
    END IF;
    IF args IS NULL THEN
        RAISE EXCEPTION 'arguments must be a JSON array or object' USING ERRCODE = '22023';
    END IF;
    IF procedure IS NOT NULL THEN
        proc_parts := radix._split_qualified(procedure, 'procedure');
    END IF;
    RETURN radix._change_job(current_user, job, enabled, schedule, run_as, procedure,
                             CASE WHEN procedure IS NOT NULL
                                  THEN radix._resolve_call(proc_parts[1], proc_parts[2], args) END,
                             radix._normalise_options(options), reset, rename_to);
END $$;
GRANT EXECUTE ON FUNCTION radix.alter_job(text, boolean, jsonb, text, text, jsonb, jsonb, text[], text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION radix._change_job(name, text, boolean, jsonb, text, text, jsonb, jsonb, text[], text)
    TO PUBLIC;

-- As 0010, with the options (normalised) instead of deadline_ms.
DROP FUNCTION radix._create_job(name, text, jsonb, text, text, jsonb, boolean, boolean, integer);
CREATE FUNCTION radix._create_job(creator name, job text, schedule jsonb, run_as text, procedure text,
                                  binding jsonb, enabled boolean, if_not_exists boolean, opts jsonb)
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
    bound jsonb;
    j radix.jobs;
BEGIN
    IF existing IS NOT NULL THEN
        RETURN existing;
    END IF;
    IF schedule ? 'time_zone' AND opts ? 'time_zone' THEN
        RAISE EXCEPTION 'the time zone is given twice (TIME ZONE and time_zone)' USING ERRCODE = '22023';
    END IF;
    principal := radix._check_principal(caller, caller, run_as);
    bound := radix._check_binding(proc_parts[1], proc_parts[2], binding);
    j := radix._with_options(radix._with_schedule(j, radix._normalise_schedule(schedule)), opts, NULL);
    INSERT INTO radix.jobs (schema_name, job_name, owner_oid, owner_name, principal_oid, principal_name,
                            procedure_oid, procedure_signature, arguments, schedule_kind, interval_ns,
                            starting_at_ns, at_ns, cron_expression, cron_time_zone, enabled, deadline_ms,
                            max_attempts, history_limit, coalesce_ticks)
    VALUES (job_parts[1], job_parts[2], caller, (SELECT rolname FROM pg_roles WHERE oid = caller),
            principal.oid, principal.rolname, (bound->>'procedure_oid')::oid, bound->>'signature',
            bound->'arguments', j.schedule_kind, j.interval_ns, j.starting_at_ns, j.at_ns, j.cron_expression,
            j.cron_time_zone, coalesce(enabled, true), coalesce(j.deadline_ms, 240000),
            coalesce(j.max_attempts, 5), coalesce(j.history_limit, 256), coalesce(j.coalesce_ticks, true))
    RETURNING * INTO j;
    PERFORM radix._rearm(j, false);
    RETURN j.job_id;
END $$;
GRANT EXECUTE ON FUNCTION radix._create_job(name, text, jsonb, text, text, jsonb, boolean, boolean, jsonb)
    TO PUBLIC;

-- Does `job` exist (for CREATE OR REPLACE: replace it, or create it)? Any caller may ask of a name.
CREATE FUNCTION radix._job_exists(job text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN EXISTS (SELECT 1 FROM radix.jobs j, radix._split_qualified(job, 'job') AS p(parts)
               WHERE j.schema_name = p.parts[1] AND j.job_name = p.parts[2]);
GRANT EXECUTE ON FUNCTION radix._job_exists(text) TO PUBLIC;

-- Public entry point: as 0010, with `options` (WITH (...): timeout, max_attempts, history, coalesce,
-- time_zone; `timeout` wins over deadline_ms) and `or_replace` (CREATE OR REPLACE JOB: an existing job
-- keeps its id, owner and history, everything else is replaced, options not given go back to their
-- defaults; admitted as ALTER JOB ... SET admits each change). Signature changed: dropped and created again.
DROP FUNCTION radix.create_job(text, jsonb, text, text, jsonb, boolean, boolean, integer, interval);
CREATE FUNCTION radix.create_job(job text, schedule jsonb, run_as text, procedure text,
                                 arguments jsonb DEFAULT '[]', enabled boolean DEFAULT true,
                                 if_not_exists boolean DEFAULT false, deadline_ms integer DEFAULT 240000,
                                 timeout interval DEFAULT NULL, options jsonb DEFAULT NULL,
                                 or_replace boolean DEFAULT false)
RETURNS uuid LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    args jsonb := radix._normalise_arguments(arguments);
    proc_parts text[] := radix._split_qualified(procedure, 'procedure');
    opts jsonb;
    existing uuid;
BEGIN
    IF args IS NULL THEN
        RAISE EXCEPTION 'arguments must be a JSON array or object' USING ERRCODE = '22023';
    END IF;
    IF or_replace AND if_not_exists THEN
        RAISE EXCEPTION 'CREATE OR REPLACE JOB cannot take IF NOT EXISTS' USING ERRCODE = '42601';
    END IF;
    opts := radix._normalise_options(options);
    IF timeout IS NOT NULL THEN
        opts := opts || radix._normalise_options(jsonb_build_object('timeout', timeout::text));
    ELSIF NOT opts ? 'deadline_ms' AND deadline_ms IS NOT NULL THEN
        opts := opts || jsonb_build_object('deadline_ms', radix._check_timeout(deadline_ms, deadline_ms::text || ' ms'));
    END IF;
    IF or_replace AND radix._job_exists(job) THEN
        PERFORM radix._change_job(current_user, job, coalesce(enabled, true), schedule, run_as, procedure,
                                  radix._resolve_call(proc_parts[1], proc_parts[2], args), opts,
                                  ARRAY['timeout', 'max_attempts', 'history', 'coalesce', 'time_zone'], NULL);
        RETURN (SELECT o.job_id FROM radix.job_overview o, radix._split_qualified(job, 'job') AS p(parts)
                WHERE o.schema_name = p.parts[1] AND o.job_name = p.parts[2]);
    END IF;
    existing := radix._admit(current_user, job, run_as, if_not_exists);
    IF existing IS NOT NULL THEN
        RETURN existing;
    END IF;
    RETURN radix._create_job(current_user, job, schedule, run_as, procedure,
                             radix._resolve_call(proc_parts[1], proc_parts[2], args), enabled,
                             if_not_exists, opts);
END $$;
GRANT EXECUTE ON FUNCTION radix.create_job(text, jsonb, text, text, jsonb, boolean, boolean, integer, interval,
                                           jsonb, boolean) TO PUBLIC;

-- -- replaced from 0010: the claim --------------------------------------------------------------------

-- As 0010, and: a request's tick (RUN JOB, backfill) is never coalesced, and is claimed whether or not
-- cron ticks await planning (its time is fixed); with coalesce = off an EVERY
-- job's missed ticks are run oldest first, at most radix.max_missed_ticks() of them (older ones are
-- skipped and counted as coalesced); the history row says what started the attempt (run_kind); and each
-- job keeps its own number of history rows (history_limit).
CREATE OR REPLACE FUNCTION radix.claim_due(node text, max_claims integer, with_cron boolean DEFAULT true,
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
                  AND (s.fence_token IS NULL OR NOT radix.node_alive(s.fence_node))
                  AND (with_cron OR s.request_kind IS NOT NULL OR NOT EXISTS (
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
                         AND s.request_kind IS NULL
                    THEN s.planned_ns + greatest(
                             (now_ns - s.planned_ns) / j.interval_ns
                             - CASE WHEN j.coalesce_ticks THEN 0 ELSE radix.max_missed_ticks() - 1 END,
                             0) * j.interval_ns
                    ELSE s.planned_ns END AS new_planned,
               coalesce(s.request_kind, 'schedule') AS run_kind,
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
                  s.idempotency_key, d.resumed, d.run_kind,
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
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind)
        SELECT c.job_id, c.definition_version, c.planned_ns, c.attempt, c.idempotency_key, 'running', node,
               c.run_kind
        FROM claimed c WHERE NOT c.resumed
        RETURNING 1
    )
    SELECT c.job_id, c.definition_version, c.lease_token, c.planned_ns, c.attempt, c.idempotency_key,
           c.resumed, c.coalesced, c.anchor_ns
    FROM claimed c;

    -- resumed claims: the lost row was closed above; the new attempt gets its own row
    IF resuming THEN
        INSERT INTO radix.radix_system_job_history
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind)
        SELECT s.job_id, s.definition_version, s.planned_ns, s.attempt, s.idempotency_key, 'running', node,
               coalesce(s.request_kind, 'schedule')
        FROM unnest(picked) AS p(job_id) JOIN radix.radix_system_job_state s ON s.job_id = p.job_id
        WHERE s.lease_node = node AND s.status = 'running' AND s.updated_at = now_ts
          AND NOT EXISTS (SELECT 1 FROM radix.radix_system_job_history h
                          WHERE h.job_id = s.job_id AND h.planned_ns = s.planned_ns
                            AND h.attempt = s.attempt AND h.status = 'running');
    END IF;
    -- keep at most `history` rows per job (WITH (history = N), 256 by default)
    DELETE FROM radix.radix_system_job_history h USING unnest(picked) AS p(job_id)
    WHERE h.job_id = p.job_id AND h.history_id <= (
        SELECT o.history_id FROM radix.radix_system_job_history o WHERE o.job_id = p.job_id
        ORDER BY o.history_id DESC
        OFFSET (SELECT j.history_limit FROM radix.jobs j WHERE j.job_id = p.job_id) LIMIT 1);
END $$;

-- -- replaced from 0010: the views ---------------------------------------------------------------------

-- As 0010, with the options, the request in progress and the queued requests.
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
       s.idempotency_key, s.lease_node, s.lease_expires_at, s.coalesced_ticks, s.last_error,
       j.max_attempts, j.history_limit, j.coalesce_ticks, s.request_kind,
       (SELECT count(*) FROM radix.job_requests q WHERE q.job_id = j.job_id) AS queued_runs
FROM radix.jobs j LEFT JOIN radix.radix_system_job_state s USING (job_id)
WHERE radix._owner_visible(j.owner_oid);

CREATE OR REPLACE VIEW radix.job_history WITH (security_barrier) AS
SELECT h.history_id, h.job_id, quote_ident(j.schema_name) || '.' || quote_ident(j.job_name) AS name,
       h.definition_version, h.planned_ns, radix.from_ns(h.planned_ns) AS planned_at, h.attempt,
       h.idempotency_key, h.status, h.node, h.atomic, h.started_at, h.finished_at,
       h.finished_at - h.started_at AS duration, h.error, h.run_kind
FROM radix.radix_system_job_history h JOIN radix.jobs j USING (job_id)
WHERE radix._owner_visible(j.owner_oid);

-- Internal: the scheduler's (and the definer functions') only.
REVOKE ALL ON FUNCTION radix._promote_request(uuid), radix._job_for_change(oid, text), radix._rearm(radix.jobs, boolean),
    radix._with_options(radix.jobs, jsonb, text[]), radix._with_schedule(radix.jobs, jsonb),
    radix._check_principal(oid, oid, text) FROM PUBLIC;

-- -- replaced from 0003: finish_attempt clears a fence ------------------------------------------------

-- As 0003, and an attempt whose lease was lost by a re-arm (its token is the fence) clears the fence when
-- its node reports it ended, so the job's next attempt may start.
CREATE OR REPLACE FUNCTION radix.finish_attempt(job uuid, token uuid, outcome text, error jsonb,
                                                retry_delay_ns bigint, next_planned_ns bigint,
                                                atomic boolean, mark_non_atomic boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s radix.radix_system_job_state;
    ok boolean;
BEGIN
    SELECT * INTO s FROM radix.radix_system_job_state
    WHERE job_id = job AND lease_token = token AND status = 'running' FOR UPDATE;
    IF NOT FOUND THEN
        UPDATE radix.radix_system_job_state SET fence_node = NULL, fence_token = NULL
        WHERE job_id = job AND fence_token = token;
        IF FOUND THEN
            PERFORM radix._hint('radix_jobs', job::text);
        END IF;
        RETURN false;
    END IF;
    IF outcome = 'retrying' THEN
        UPDATE radix.radix_system_job_state SET status = 'retry_wait',
            due_ns = radix.to_ns(clock_timestamp()) + retry_delay_ns,
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, last_error = error,
            updated_at = clock_timestamp()
        WHERE job_id = job;
    ELSE
        ok := radix._advance(job, token, next_planned_ns, outcome = 'succeeded', error);
    END IF;
    UPDATE radix.radix_system_job_history SET status = outcome, error = finish_attempt.error,
        finished_at = clock_timestamp(), atomic = finish_attempt.atomic
    WHERE job_id = job AND planned_ns = s.planned_ns AND attempt = s.attempt AND status = 'running';
    IF mark_non_atomic THEN
        UPDATE radix.jobs SET non_atomic = true WHERE job_id = job AND NOT non_atomic;
    END IF;
    DELETE FROM radix.attempt_frames WHERE job_id = job AND lease_token = token;
    RETURN true;
END $$;

-- ===== 0012_hot_path.sql =====
-- 0012: the hot path (issue #14). An atomic attempt is one simple-protocol query on the principal's
-- connection, its statements leaner; same checks, same fence, same writes, no foreign-key checks on the
-- hot rows.
--
-- One query. The daemon sends `BEGIN; set_config + begin_atomic; DO (the CALL); end_atomic; COMMIT;` and
-- then the connection's clean as one simple query (one message: psycopg's extended-protocol pipeline cost
-- five times the client CPU). Its text is readable by the procedure (current_query()) and by the principal's other
-- sessions (pg_stat_activity), so it must not carry the lease token, which begin_attempt trusts: it
-- carries a MAC of the token instead, valid only on the backend that runs the attempt:
--   session key  k = sha256(secret || pid || backend_start)        (radix.attempt_session(): this backend's)
--   attempt MAC  m = sha256(k || lease_token)                       (computed by the daemon)
-- The secret (radix.attempt_secret) is readable by radix alone. Both messages have a fixed length, so
-- the secret-prefix hash is a MAC (a length extension yields a longer message, which is never accepted).
-- A MAC read from the text is good for nothing elsewhere: another backend has another session key.
-- On the same backend it is good only while the token lives, and the daemon does not reuse a backend
-- for another attempt before the attempt's tick is recorded (a new token, or none); inside the attempt's
-- own transaction, a forged begin or end destroys or replaces the attempt's frame, so the daemon's
-- end_atomic fails and everything rolls back. tests/security/test_attempt_mac.py attacks each of these.
-- The non-atomic path keeps the bound token (begin_attempt / end_attempt, extended protocol).
--
-- Foreign keys. A history row (inserted by every claim) and a frame row (by every begin) no longer
-- reference radix.jobs. Each of those inserts ran a referential check: a query, and a KEY SHARE lock on
-- the job's row (a heap write and a WAL record per insert, measured at 30-45 us per insert and commit).
-- Only radix's own definer functions write these tables, always for a job whose state row they hold
-- locked, so the check never refused anything. What the ON DELETE CASCADE did, a trigger on radix.jobs
-- does: dropping a job deletes its history and frames in the same transaction, as before. A job being
-- dropped while an attempt holds its state row waits for that attempt (the state row still cascades).
--
-- begin_atomic reads the claim, the job, the identity, the owner's right to act as the principal and
-- the procedure's privileges in one statement (begin_attempt ran seven, and a call of radix.may_act_as,
-- whose SET clause made it a function call per attempt). The checks and their order are the same: the
-- first that fails raises the same SQLSTATE and message as before.
--
-- end_atomic advances a scheduled tick (no request in flight) with one UPDATE joined to the job, and
-- probes radix.job_requests after it as radix._advance does; a request's tick still goes through
-- radix._advance (stash, backfill ledger).

DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT con.conrelid::regclass AS tab, con.conname
             FROM pg_constraint con
             WHERE con.contype = 'f' AND con.confrelid = 'radix.jobs'::regclass
               AND con.conrelid IN ('radix.radix_system_job_history'::regclass, 'radix.attempt_frames'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', c.tab, c.conname);
    END LOOP;
END $$;

-- What the two ON DELETE CASCADE did: a dropped job's history and frames go with it.
CREATE FUNCTION radix._job_dropped() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM radix.radix_system_job_history h WHERE h.job_id = OLD.job_id;
    DELETE FROM radix.attempt_frames f WHERE f.job_id = OLD.job_id;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION radix._job_dropped() FROM PUBLIC;

CREATE TRIGGER job_dropped AFTER DELETE ON radix.jobs
    FOR EACH ROW EXECUTE FUNCTION radix._job_dropped();

-- -- the attempt MAC ------------------------------------------------------------------------------------

-- One row: 32 bytes from two gen_random_uuid() (pg_strong_random; 244 random bits). Nobody but radix
-- reads it; a new secret (UPDATE as radix) only makes attempts in flight fail their begin and retry.
CREATE TABLE radix.attempt_secret (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret   bytea NOT NULL
);
INSERT INTO radix.attempt_secret (secret)
VALUES (uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));
REVOKE ALL ON radix.attempt_secret FROM PUBLIC;

-- This backend's session key: sha256(secret || pid || backend_start), both fixed-length.
CREATE FUNCTION radix._session_key() RETURNS bytea
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN (SELECT sha256(k.secret || int4send(pg_backend_pid()) || timestamptz_send(a.backend_start))
        FROM radix.attempt_secret k, pg_stat_get_activity(pg_backend_pid()) a);

-- The MAC of `token` for this backend, as the daemon computes it: hex of sha256(session key || token).
CREATE FUNCTION radix._attempt_mac(token uuid) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN encode(sha256(radix._session_key() || uuid_send(token)), 'hex');
REVOKE ALL ON FUNCTION radix._session_key(), radix._attempt_mac(uuid) FROM PUBLIC;

-- The session key of the calling backend (hex), for the daemon to compute MACs for this connection. Any
-- role may ask for its own: it opens nothing without a lease token, which only the scheduler holds.
CREATE FUNCTION radix.attempt_session() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN encode(radix._session_key(), 'hex');

-- As 0003's begin_attempt, keyed by the MAC: the claim, the identity and the privileges, then the frame.
-- The KEY SHARE lock on the state row is held until the attempt's transaction ends (the fence, see 0003).
CREATE FUNCTION radix.begin_atomic(job uuid, mac text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- one read of this backend's status (it copies every backend's entry): the MAC and the frame share it
    started timestamptz := (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a);
    c record;
BEGIN
    -- refused: 0 ok; 1 not logged in as the principal; 2 the owner may no longer act as it (the rule of
    -- radix.may_act_as, inlined); 3 the procedure is gone (or renamed); 4 no privilege to run it
    SELECT s.attempt, s.planned_ns, s.idempotency_key, s.lease_token, j.procedure_signature,
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
    WHERE s.job_id = job AND s.status = 'running'
      -- radix._attempt_mac(s.lease_token), inlined
      AND encode(sha256(sha256(k.secret || int4send(pg_backend_pid()) || timestamptz_send(started))
                        || uuid_send(s.lease_token)), 'hex') = mac
    FOR KEY SHARE OF s;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the claim of this attempt is no longer held' USING ERRCODE = 'RXL01';
    ELSIF c.refused = 1 THEN
        RAISE EXCEPTION 'permission denied: the attempt is not logged in as its principal'
            USING ERRCODE = '42501';
    ELSIF c.refused = 2 THEN
        RAISE EXCEPTION 'permission denied: the job owner may no longer act as its principal'
            USING ERRCODE = '42501';
    ELSIF c.refused = 3 THEN
        RAISE EXCEPTION 'procedure % no longer exists', c.procedure_signature USING ERRCODE = '42883';
    ELSIF c.refused = 4 THEN
        RAISE EXCEPTION 'permission denied for procedure %', c.procedure_signature USING ERRCODE = '42501';
    END IF;
    INSERT INTO radix.attempt_frames AS f
        (pid, backend_start, job_id, attempt, planned_ns, idempotency_key, lease_token)
    VALUES (pg_backend_pid(), started, job, c.attempt, c.planned_ns, c.idempotency_key, c.lease_token)
    ON CONFLICT (pid) DO UPDATE SET backend_start = excluded.backend_start, job_id = excluded.job_id,
        attempt = excluded.attempt, planned_ns = excluded.planned_ns,
        idempotency_key = excluded.idempotency_key, lease_token = excluded.lease_token;
END $$;

-- As 0003's end_attempt (atomic, with 0011's requests), keyed by the MAC: the frame closed and the tick
-- marked succeeded in the attempt's own transaction, fenced by the lease token the frame holds.
CREATE FUNCTION radix.end_atomic(job uuid, mac text, next_planned_ns bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f record;
BEGIN
    -- the frame begin_atomic wrote on this backend holds its backend_start: the MAC without pg_stat
    DELETE FROM radix.attempt_frames d WHERE d.pid = pg_backend_pid() AND d.job_id = job
    RETURNING d.planned_ns, d.attempt, d.lease_token,
              (SELECT encode(sha256(sha256(k.secret || int4send(d.pid) || timestamptz_send(d.backend_start))
                                    || uuid_send(d.lease_token)), 'hex') FROM radix.attempt_secret k) AS mac
    INTO f;
    IF NOT FOUND OR f.mac IS DISTINCT FROM mac THEN
        RAISE EXCEPTION 'the frame of this attempt is gone' USING ERRCODE = 'RXL01';
    END IF;
    -- a scheduled tick: what radix._advance(job, token, next_planned_ns, true, NULL) writes, in one UPDATE
    UPDATE radix.radix_system_job_state s SET
        status = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN 'complete' ELSE 'scheduled' END,
        planned_ns = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN s.planned_ns
                          ELSE next_planned_ns END,
        due_ns = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN NULL ELSE next_planned_ns END,
        attempt = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN s.attempt ELSE 0 END,
        idempotency_key = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN s.idempotency_key END,
        lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, last_error = NULL,
        updated_at = clock_timestamp()
    FROM radix.jobs j
    WHERE s.job_id = job AND s.lease_token = f.lease_token AND s.status = 'running' AND s.request_kind IS NULL
      AND j.job_id = s.job_id;
    IF FOUND THEN
        IF EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = job) THEN
            PERFORM radix._promote_request(job);
        END IF;
    ELSIF NOT radix._advance(job, f.lease_token, next_planned_ns, true, NULL) THEN  -- a request's, or fenced
        RAISE EXCEPTION 'the claim of this attempt is no longer held' USING ERRCODE = 'RXL01';
    END IF;
    UPDATE radix.radix_system_job_history
    SET status = 'succeeded', atomic = true, finished_at = clock_timestamp()
    WHERE job_id = job AND planned_ns = f.planned_ns AND attempt = f.attempt AND status = 'running';
END $$;

GRANT EXECUTE ON FUNCTION radix.attempt_session(), radix.begin_atomic(uuid, text),
    radix.end_atomic(uuid, text, bigint) TO PUBLIC;

-- The token-keyed pair (bound parameters: the non-atomic path) is the MAC-keyed one.
CREATE OR REPLACE FUNCTION radix.begin_attempt(job uuid, token uuid) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM radix.begin_atomic(job, radix._attempt_mac(token));
END $$;

CREATE OR REPLACE FUNCTION radix.end_attempt(job uuid, token uuid, next_planned_ns bigint, atomic boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF atomic THEN
        PERFORM radix.end_atomic(job, radix._attempt_mac(token), next_planned_ns);
        RETURN;
    END IF;
    DELETE FROM radix.attempt_frames WHERE pid = pg_backend_pid() AND job_id = job AND lease_token = token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the frame of this attempt is gone' USING ERRCODE = 'RXL01';
    END IF;
END $$;

-- -- replaced from 0011: the claim ------------------------------------------------------------------------

-- As 0011, serialised by a table lock on radix.claim_serial instead of a row lock on its one row. The row
-- lock wrote the tuple (xmax) and a WAL record at every claim, so a claim that found nothing due still
-- assigned a transaction id and waited for a WAL flush at commit (0.3-0.9 ms, measured with pgbench under
-- load, against 0.05 ms for the table lock). EXCLUSIVE conflicts with itself, so claims still serialise;
-- only radix (the table's owner) may lock it: no other role can hold it.
CREATE OR REPLACE FUNCTION radix.claim_due(node text, max_claims integer, with_cron boolean DEFAULT true,
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
    -- a table lock, not a row lock: no tuple written, no WAL, so a claim that finds nothing commits nothing
    LOCK TABLE radix.claim_serial IN EXCLUSIVE MODE;
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
                  AND (s.fence_token IS NULL OR NOT radix.node_alive(s.fence_node))
                  AND (with_cron OR s.request_kind IS NOT NULL OR NOT EXISTS (
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
                         AND s.request_kind IS NULL
                    THEN s.planned_ns + greatest(
                             (now_ns - s.planned_ns) / j.interval_ns
                             - CASE WHEN j.coalesce_ticks THEN 0 ELSE radix.max_missed_ticks() - 1 END,
                             0) * j.interval_ns
                    ELSE s.planned_ns END AS new_planned,
               coalesce(s.request_kind, 'schedule') AS run_kind,
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
                  s.idempotency_key, d.resumed, d.run_kind,
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
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind)
        SELECT c.job_id, c.definition_version, c.planned_ns, c.attempt, c.idempotency_key, 'running', node,
               c.run_kind
        FROM claimed c WHERE NOT c.resumed
        RETURNING 1
    )
    SELECT c.job_id, c.definition_version, c.lease_token, c.planned_ns, c.attempt, c.idempotency_key,
           c.resumed, c.coalesced, c.anchor_ns
    FROM claimed c;

    -- resumed claims: the lost row was closed above; the new attempt gets its own row
    IF resuming THEN
        INSERT INTO radix.radix_system_job_history
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind)
        SELECT s.job_id, s.definition_version, s.planned_ns, s.attempt, s.idempotency_key, 'running', node,
               coalesce(s.request_kind, 'schedule')
        FROM unnest(picked) AS p(job_id) JOIN radix.radix_system_job_state s ON s.job_id = p.job_id
        WHERE s.lease_node = node AND s.status = 'running' AND s.updated_at = now_ts
          AND NOT EXISTS (SELECT 1 FROM radix.radix_system_job_history h
                          WHERE h.job_id = s.job_id AND h.planned_ns = s.planned_ns
                            AND h.attempt = s.attempt AND h.status = 'running');
    END IF;
    -- keep at most `history` rows per job (WITH (history = N), 256 by default)
    DELETE FROM radix.radix_system_job_history h USING unnest(picked) AS p(job_id)
    WHERE h.job_id = p.job_id AND h.history_id <= (
        SELECT o.history_id FROM radix.radix_system_job_history o WHERE o.job_id = p.job_id
        ORDER BY o.history_id DESC
        OFFSET (SELECT j.history_limit FROM radix.jobs j WHERE j.job_id = p.job_id) LIMIT 1);
END $$;

-- ===== 0013_one_transaction_tick.sql =====
-- 0013: the one-transaction tick (issue #14). An atomic attempt of a scheduled tick commits in ONE
-- transaction on the principal's connection: no claim is written before it, nothing after it.
--
--   scheduler connection:  radix.find_ticks(...)          read, plus a row lock per tick found (no tuple
--                                                          written but the lock), released at its commit
--   principal connection:  BEGIN; set_config + radix.begin_tick(job, planned, mac); DO (the CALL);
--                          radix.end_tick(job, mac, next, node); COMMIT; <the clean>     (one simple query)
--
-- The fence is a row lock: begin_tick locks the job's row of radix.tick_locks (FOR UPDATE SKIP LOCKED) and
-- holds it until the tick's transaction ends; another node's begin_tick and the finder skip a locked row,
-- and the lease claim (radix.claim_due) skips the state row, which the tick holds FOR KEY SHARE as
-- begin_atomic does. So a tick runs on one backend at a time; a daemon that dies takes
-- its backend's transaction with it (client_connection_check_interval), the lock is released and the
-- tick is due again at once: no lease to wait out. ALTER JOB and the other verbs never touch
-- radix.tick_locks, so they do not wait for a tick (DROP JOB does, as it waited for an atomic attempt).
--
-- The tick's token. The finder hands out, per tick, L = the first 16 bytes of
--   sha256(secret || job_id || planned_ns || state.attempt || state.updated_at)     (as a uuid)
-- where planned_ns is the tick it chose (coalesced). L is secret-derived, as unguessable as a random lease
-- token, and it dies when the job's tick changes: its attempt, or any claim, advance, retry, re-arm or
-- request of the job (each sets updated_at; begin_tick also demands a status a tick may start from). The query text
-- carries only its MAC for the backend, sha256(session key || L) (0012's attempt_mac), so a principal
-- reading it (current_query(), pg_stat_activity) learns nothing usable elsewhere; on the same backend it
-- is good while the state is unchanged, and the daemon does not reuse the connection before the tick's
-- outcome is recorded. begin_tick and end_tick recompute L from the state row and check the MAC.
--
-- The frame stays a row of radix.attempt_frames, inserted by begin_tick and deleted by end_tick in the
-- same transaction (no other session ever sees it): radix.current_*() read it as before, and the
-- procedure cannot forge or change it (radix's table; end_tick checks its MAC like end_atomic).
--
-- Writes of a successful tick: the tick lock (a lock, no new tuple), the frame INSERT and DELETE, the
-- state UPDATE, one history INSERT (written once, 'succeeded'), and the prune of the job's oldest history rows
-- past its limit (none, mostly); one commit. Before: a claim transaction
-- (state UPDATE, history INSERT, prune DELETE) and the attempt (frame INSERT and DELETE, state UPDATE,
-- history UPDATE): two commits.
--
-- What keeps the lease (radix.claim_due, which the daemon asks to leave the ticks alone): non-atomic jobs and
-- cron jobs (state.via_lease), RUN JOB and backfill requests, expired leases and dead nodes' claims. A
-- tick also becomes a lease (radix.claim_tick with L as the lease token):
--   - when it fails: its transaction rolled back, the daemon records the attempt as a claim of exactly
--     that tick, finished at once (radix.finish_attempt): retry_wait or the next tick, one history row;
--   - when its procedure commits inside (2D000): the claim, then today's non-atomic path;
--   - when it has run for a second (published): the state shows it running, its lease is renewed and
--     fenced like any other, and end_tick then ends it through radix._advance (fenced by L).

-- -- storage -------------------------------------------------------------------------------------------

CREATE TABLE radix.tick_locks (
    job_id uuid PRIMARY KEY REFERENCES radix.jobs ON DELETE CASCADE
);
INSERT INTO radix.tick_locks (job_id) SELECT job_id FROM radix.jobs;
REVOKE ALL ON radix.tick_locks FROM PUBLIC;

CREATE FUNCTION radix._job_tick_lock() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO radix.tick_locks (job_id) VALUES (NEW.job_id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION radix._job_tick_lock() FROM PUBLIC;
CREATE TRIGGER job_tick_lock AFTER INSERT ON radix.jobs
    FOR EACH ROW EXECUTE FUNCTION radix._job_tick_lock();

-- Which jobs' ticks take the lease path whatever happens: non-atomic procedures and cron schedules (their
-- ticks are planned, and missed ones coalesced, by the daemon before the claim). Kept from radix.jobs as
-- principal_oid is (0007).
ALTER TABLE radix.radix_system_job_state ADD COLUMN via_lease boolean NOT NULL DEFAULT false;
UPDATE radix.radix_system_job_state s SET via_lease = j.non_atomic OR j.schedule_kind = 'cron'
FROM radix.jobs j WHERE j.job_id = s.job_id;

CREATE OR REPLACE FUNCTION radix._state_principal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT j.principal_oid, j.non_atomic OR j.schedule_kind = 'cron' INTO NEW.principal_oid, NEW.via_lease
    FROM radix.jobs j WHERE j.job_id = NEW.job_id;
    RETURN NEW;
END $$;

CREATE FUNCTION radix._job_path_changed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE radix.radix_system_job_state SET via_lease = NEW.non_atomic OR NEW.schedule_kind = 'cron'
    WHERE job_id = NEW.job_id AND via_lease IS DISTINCT FROM (NEW.non_atomic OR NEW.schedule_kind = 'cron');
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION radix._job_path_changed() FROM PUBLIC;
CREATE TRIGGER job_path_changed AFTER UPDATE OF non_atomic, schedule_kind ON radix.jobs
    FOR EACH ROW EXECUTE FUNCTION radix._job_path_changed();

-- Due work of the lease path, found without reading the atomic backlog.
CREATE INDEX radix_system_job_state_lease_due ON radix.radix_system_job_state (due_ns)
    WHERE status IN ('scheduled', 'running', 'retry_wait')
      AND (via_lease OR request_kind IS NOT NULL OR status = 'running');

-- The token of a tick (see the header): the state row as found, and the tick chosen.
CREATE FUNCTION radix._tick_token(job uuid, planned_ns bigint, attempt integer, updated_at timestamptz)
RETURNS uuid
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN (SELECT encode(substring(sha256(k.secret || uuid_send(job) || int8send(planned_ns) || int4send(attempt)
                                       || timestamptz_send(updated_at)) FROM 1 FOR 16), 'hex')::uuid
        FROM radix.attempt_secret k);
REVOKE ALL ON FUNCTION radix._tick_token(uuid, bigint, integer, timestamptz) FROM PUBLIC;

-- Keep at most `history` rows of a job (WITH (history = N), 256 by default), as radix.claim_due does at every
-- claim: one backward scan of radix_system_job_history_job that stops at the job's limit.
CREATE FUNCTION radix._prune_history(job uuid) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM radix.radix_system_job_history h
    WHERE h.job_id = job AND h.history_id <= (
        SELECT o.history_id FROM radix.radix_system_job_history o WHERE o.job_id = job
        ORDER BY o.history_id DESC
        OFFSET (SELECT j.history_limit FROM radix.jobs j WHERE j.job_id = job) LIMIT 1)
$$;
REVOKE ALL ON FUNCTION radix._prune_history(uuid) FROM PUBLIC;

-- -- finding ---------------------------------------------------------------------------------------------

-- Attempts of each principal running now, not counting this node's own (the daemon counts those): leases
-- of other nodes, and the principal's sessions that radixjobs opened elsewhere and that are in a
-- transaction or a statement (a tick, or a non-atomic CALL) without a committed frame (a non-atomic
-- attempt has one, and its lease is counted already). A published tick of another node counts twice:
-- over, never under. A role can only raise its own count by naming its sessions like radixjobs'.
CREATE FUNCTION radix._running_elsewhere(node text, mine integer[])
RETURNS TABLE (principal oid, running integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT x.p, sum(x.n)::integer FROM (
        SELECT s.principal_oid AS p, count(*) AS n
        FROM radix.radix_system_job_state s WHERE s.status = 'running' AND s.lease_node <> node
        GROUP BY s.principal_oid
        UNION ALL
        SELECT a.usesysid, count(*)
        FROM pg_stat_get_activity(NULL) a
        WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
          AND a.application_name = 'radixjobs-attempt' AND a.state IN ('active', 'idle in transaction')
          AND a.pid <> ALL (coalesce(mine, '{}'))
          AND NOT EXISTS (SELECT 1 FROM radix.attempt_frames f WHERE f.pid = a.pid)
        GROUP BY a.usesysid) x
    GROUP BY x.p
$$;

-- find_ticks: up to `max_ticks` ticks for the one-transaction path, due now or within `horizon_ms`, in due
-- order per principal, the principals dealt round-robin (radix._claim_shares, fewest running first).
-- `skip`: the jobs whose ticks this node holds already (queued or running); `mine`: the backend pids of
-- its principal sessions. Each row says how many attempts its principal runs elsewhere (the daemon adds
-- its own and applies the cap when it starts the tick). A tick that another transaction runs (its lock
-- held) is skipped. Writes no tuple: the row locks end with the statement's transaction.
CREATE FUNCTION radix.find_ticks(node text, max_ticks integer, horizon_ms integer, skip uuid[], mine integer[])
RETURNS TABLE (job_id uuid, definition_version bigint, planned_ns bigint, attempt integer, coalesced bigint,
               anchor_ns bigint, due_in_ms float8, token uuid, principal oid, elsewhere integer)
LANGUAGE plpgsql VOLATILE ROWS 64
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    until_ns bigint := now_ns + greatest(coalesce(horizon_ms, 0), 0)::bigint * 1000000;
    ps oid[];
    runs integer[];
    dues bigint[];
BEGIN
    -- a request queued while a tick held its job (radix._promote_request left it) is installed now
    IF EXISTS (SELECT 1 FROM radix.job_requests) THEN
        PERFORM radix._promote_request(q.job_id)
        FROM (SELECT DISTINCT r.job_id FROM radix.job_requests r) q
        JOIN radix.radix_system_job_state s ON s.job_id = q.job_id
        WHERE s.request_kind IS NULL AND s.status NOT IN ('running', 'retry_wait');
    END IF;
    IF coalesce(max_ticks, 0) <= 0
       OR NOT coalesce((SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                        WHERE s.status IN ('scheduled', 'running', 'retry_wait')) <= until_ns, false) THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(l.principal), '{}'), coalesce(array_agg(coalesce(e.running, 0)), '{}'),
           coalesce(array_agg(l.first_due_ns), '{}')
    INTO ps, runs, dues
    FROM radix._principal_load() l
    LEFT JOIN radix._running_elsewhere(node, mine) e ON e.principal = l.principal
    WHERE l.first_due_ns <= until_ns;
    IF cardinality(ps) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH shares AS (
        SELECT sh.principal AS p, sh.share AS n FROM radix._claim_shares(ps, runs, dues, max_ticks, NULL) sh
        WHERE cardinality(ps) > 1
        UNION ALL
        SELECT ps[1], max_ticks WHERE cardinality(ps) = 1
    ), found AS (
        SELECT c.* FROM shares q
        CROSS JOIN LATERAL (
            SELECT s.job_id, s.definition_version, s.planned_ns, s.attempt, s.due_ns, s.status, s.anchor_ns,
                   s.updated_at, s.principal_oid
            FROM radix.radix_system_job_state s
            JOIN radix.tick_locks t ON t.job_id = s.job_id
            WHERE s.principal_oid = q.p
              AND s.status IN ('scheduled', 'retry_wait') AND s.due_ns <= until_ns
              AND s.planned_ns IS NOT NULL AND NOT s.via_lease AND s.request_kind IS NULL
              AND s.job_id <> ALL (coalesce(skip, '{}'))
              AND (s.fence_token IS NULL OR NOT radix.node_alive(s.fence_node))
              -- radix.job_has_live_frame(s.job_id), inlined as claim_due does (a call per candidate row)
              AND NOT EXISTS (
                  SELECT 1 FROM radix.attempt_frames f
                  WHERE f.job_id = s.job_id AND EXISTS (
                      SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start))
            ORDER BY s.due_ns
            LIMIT q.n
            FOR UPDATE OF t SKIP LOCKED) c
    ), decided AS (
        SELECT f.*, j.interval_ns, j.schedule_kind,
               CASE WHEN f.status = 'scheduled' AND j.schedule_kind = 'every' AND f.planned_ns <= now_ns
                    THEN f.planned_ns + greatest(
                             (now_ns - f.planned_ns) / j.interval_ns
                             - CASE WHEN j.coalesce_ticks THEN 0 ELSE radix.max_missed_ticks() - 1 END,
                             0) * j.interval_ns
                    ELSE f.planned_ns END AS run_ns
        FROM found f JOIN radix.jobs j ON j.job_id = f.job_id
    )
    SELECT d.job_id, d.definition_version, d.run_ns, d.attempt + 1,
           CASE WHEN d.schedule_kind = 'every' THEN (d.run_ns - d.planned_ns) / d.interval_ns ELSE 0 END,
           d.anchor_ns, (greatest(d.due_ns - now_ns, 0) / 1e6)::float8,
           radix._tick_token(d.job_id, d.run_ns, d.attempt, d.updated_at), d.principal_oid,
           coalesce(runs[array_position(ps, d.principal_oid)], 0)
    FROM decided d
    ORDER BY d.due_ns;
END $$;

-- Is lease-path work due (radix.claim_due would claim something)? Due rows of non-atomic and cron jobs,
-- requests, expired leases (one probe of radix_system_job_state_lease_due), and the claims of dead nodes.
CREATE FUNCTION radix.lease_work_due(node text) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                     WHERE s.status IN ('scheduled', 'running', 'retry_wait')
                       AND (s.via_lease OR s.request_kind IS NOT NULL OR s.status = 'running'))
                    <= radix.to_ns(clock_timestamp()), false)
        OR EXISTS (SELECT 1 FROM radix.radix_system_job_state s
                   WHERE s.status = 'running' AND s.lease_node <> node AND NOT radix.node_alive(s.lease_node))
$$;

-- -- the tick --------------------------------------------------------------------------------------------

-- Start the tick `planned_ns` of `job` on this backend: the tick lock, then the state as the finder saw it
-- (the MAC of its token), the same checks as begin_atomic (in the same order, same SQLSTATEs), the frame.
-- The state is read by a statement after the one that took the lock, so its snapshot is newer than the
-- lock: a tick another node committed just before is seen as committed. (Read in the same statement, the
-- snapshot could predate that commit, and a row only locked, never updated, is not re-checked.)
-- RXT01: the tick is not this backend's to run (run elsewhere, changed, or no longer due): nothing happened.
CREATE FUNCTION radix.begin_tick(job uuid, planned_ns bigint, mac text) RETURNS void
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
        RAISE EXCEPTION 'the tick is not this session''s to run: another session runs it' USING ERRCODE = 'RXT01';
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
    CROSS JOIN LATERAL (SELECT encode(substring(sha256(k.secret || uuid_send(job) || int8send(begin_tick.planned_ns)
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
        RAISE EXCEPTION 'the tick is not this session''s to run: it ran, or changed since it was found'
            USING ERRCODE = 'RXT01';
    ELSIF c.refused = 1 THEN
        RAISE EXCEPTION 'permission denied: the attempt is not logged in as its principal'
            USING ERRCODE = '42501';
    ELSIF c.refused = 2 THEN
        RAISE EXCEPTION 'permission denied: the job owner may no longer act as its principal'
            USING ERRCODE = '42501';
    ELSIF c.refused = 3 THEN
        RAISE EXCEPTION 'procedure % no longer exists', c.procedure_signature USING ERRCODE = '42883';
    ELSIF c.refused = 4 THEN
        RAISE EXCEPTION 'permission denied for procedure %', c.procedure_signature USING ERRCODE = '42501';
    END IF;
    INSERT INTO radix.attempt_frames AS f
        (pid, backend_start, job_id, attempt, planned_ns, idempotency_key, lease_token)
    VALUES (pg_backend_pid(), started, job, c.attempt + 1, begin_tick.planned_ns,
            job::text || '/' || begin_tick.planned_ns::text, c.token)
    ON CONFLICT (pid) DO UPDATE SET backend_start = excluded.backend_start, job_id = excluded.job_id,
        attempt = excluded.attempt, planned_ns = excluded.planned_ns,
        idempotency_key = excluded.idempotency_key, lease_token = excluded.lease_token;
END $$;

-- End the tick begun on this backend: the frame closed (its MAC checked), the state advanced and one
-- history row written, in the tick's own transaction. A tick published as a lease meanwhile
-- (radix.claim_tick) ends as end_atomic ends an attempt: radix._advance, fenced by its token.
-- `node` is the daemon's node id, hex-encoded (the query text carries no quotes but its own).
CREATE FUNCTION radix.end_tick(job uuid, mac text, next_planned_ns bigint, node text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- key lookups whatever the values: a custom plan per call would re-plan every statement of every tick
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    f record;
BEGIN
    DELETE FROM radix.attempt_frames d WHERE d.pid = pg_backend_pid() AND d.job_id = job
    RETURNING d.planned_ns, d.attempt, d.lease_token, d.idempotency_key,
              (SELECT encode(sha256(sha256(k.secret || int4send(d.pid) || timestamptz_send(d.backend_start))
                                    || uuid_send(d.lease_token)), 'hex') FROM radix.attempt_secret k) AS mac
    INTO f;
    IF NOT FOUND OR f.mac IS DISTINCT FROM mac THEN
        RAISE EXCEPTION 'the frame of this attempt is gone' USING ERRCODE = 'RXL01';
    END IF;
    -- not published: the state is as begin_tick found it (its token still derives from it)
    UPDATE radix.radix_system_job_state s SET
        status = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN 'complete' ELSE 'scheduled' END,
        planned_ns = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN f.planned_ns
                          ELSE next_planned_ns END,
        due_ns = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN NULL ELSE next_planned_ns END,
        attempt = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN f.attempt ELSE 0 END,
        idempotency_key = CASE WHEN j.schedule_kind = 'at' OR next_planned_ns IS NULL THEN f.idempotency_key END,
        coalesced_ticks = s.coalesced_ticks + CASE WHEN j.schedule_kind = 'every'
                                                   THEN (f.planned_ns - s.planned_ns) / j.interval_ns ELSE 0 END,
        last_error = NULL, updated_at = clock_timestamp()
    FROM radix.jobs j, radix.attempt_secret k
    WHERE s.job_id = job AND j.job_id = job AND s.status IN ('scheduled', 'retry_wait')
      AND s.request_kind IS NULL AND s.attempt = f.attempt - 1
      -- radix._tick_token(job, f.planned_ns, s.attempt, s.updated_at) = f.lease_token, inlined
      AND encode(substring(sha256(k.secret || uuid_send(job) || int8send(f.planned_ns) || int4send(s.attempt)
                                  || timestamptz_send(s.updated_at)) FROM 1 FOR 16), 'hex')::uuid = f.lease_token;
    IF FOUND THEN
        -- a history row left 'running' by a lease fenced before (ALTER JOB) belongs to no attempt now (the
        -- same close as claim_due's and claim_tick's, inline: this is the hot path)
        UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = clock_timestamp(),
            error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                                       'category', 'connection',
                                       'detail', jsonb_build_object('reason', 'job redefined'))
        WHERE h.job_id = job AND h.status = 'running';
        INSERT INTO radix.radix_system_job_history AS h
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind, atomic,
             started_at, finished_at)
        SELECT job, s.definition_version, f.planned_ns, f.attempt, f.idempotency_key, 'succeeded',
               convert_from(decode(node, 'hex'), 'UTF8'),
               'schedule', true, now(), clock_timestamp()
        FROM radix.radix_system_job_state s WHERE s.job_id = job;
        IF EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = job) THEN
            PERFORM radix._promote_request(job);
        END IF;
        PERFORM radix._prune_history(job);
        RETURN;
    END IF;
    -- published (radix.claim_tick): a lease with the tick's token
    IF NOT radix._advance(job, f.lease_token, next_planned_ns, true, NULL) THEN
        RAISE EXCEPTION 'the claim of this attempt is no longer held' USING ERRCODE = 'RXL01';
    END IF;
    UPDATE radix.radix_system_job_history
    SET status = 'succeeded', atomic = true, started_at = now(), finished_at = clock_timestamp()
    WHERE job_id = job AND planned_ns = f.planned_ns AND attempt = f.attempt AND status = 'running';
END $$;

GRANT EXECUTE ON FUNCTION radix.begin_tick(uuid, bigint, text), radix.end_tick(uuid, text, bigint, text)
    TO PUBLIC;

-- claim_tick: make the tick the finder handed out (its token `token`) a lease of `node`, as radix.claim_due
-- claims a row, with `token` as the lease token: for a tick that failed (its transaction rolled back), one
-- whose procedure commits inside (2D000), or one running for long (published: the state shows it running,
-- and its lease is renewed and fenced as any other). Returns claim_due's columns, or no row when the tick
-- is no longer as found (it ran, was re-armed, or another node took it). A tick another transaction holds
-- is claimed only when `publish` (this node's own tick holds it); otherwise it is left alone. `started_at`:
-- when the tick's attempt began, as the daemon saw it (its history row's start; end_tick corrects it).
CREATE FUNCTION radix.claim_tick(node text, job uuid, tick_ns bigint, token uuid, lease_seconds integer,
                                 publish boolean, started_at timestamptz)
RETURNS TABLE (job_id uuid, definition_version bigint, lease_token uuid, planned_ns bigint,
               attempt integer, idempotency_key text, resumed boolean, coalesced bigint, anchor_ns bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ts timestamptz := clock_timestamp();
    lease interval := make_interval(secs => greatest(coalesce(lease_seconds, 300), 1));
BEGIN
    IF NOT publish THEN
        PERFORM FROM radix.tick_locks t WHERE t.job_id = job FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- a history row still 'running' for the job belongs to no attempt (its state is not running)
    UPDATE radix.radix_system_job_history h SET status = 'lease_lost', finished_at = now_ts,
        error = jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost',
                                   'category', 'connection',
                                   'detail', jsonb_build_object('reason', 'job redefined'))
    WHERE h.job_id = job AND h.status = 'running'
      AND NOT EXISTS (SELECT 1 FROM radix.radix_system_job_state s
                      WHERE s.job_id = job AND s.status = 'running');
    RETURN QUERY
    WITH claimed AS (
        UPDATE radix.radix_system_job_state s SET
            status = 'running',
            planned_ns = tick_ns,
            attempt = s.attempt + 1,
            idempotency_key = s.job_id::text || '/' || tick_ns::text,
            lease_node = node,
            lease_token = token,
            lease_expires_at = now_ts + lease,
            due_ns = radix.to_ns(now_ts + lease),
            coalesced_ticks = s.coalesced_ticks + CASE WHEN j.schedule_kind = 'every'
                THEN (tick_ns - s.planned_ns) / j.interval_ns ELSE 0 END,
            updated_at = now_ts
        FROM radix.jobs j
        WHERE s.job_id = job AND j.job_id = job AND s.status IN ('scheduled', 'retry_wait')
          AND s.request_kind IS NULL
          AND radix._tick_token(job, tick_ns, s.attempt, s.updated_at) = token
        RETURNING s.job_id, s.definition_version, s.lease_token, s.planned_ns, s.attempt, s.idempotency_key,
                  CASE WHEN j.schedule_kind = 'every' THEN (tick_ns - s.planned_ns) / j.interval_ns
                       ELSE 0 END AS coalesced,
                  s.anchor_ns
    ), started AS (
        INSERT INTO radix.radix_system_job_history
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind, started_at)
        SELECT c.job_id, c.definition_version, c.planned_ns, c.attempt, c.idempotency_key, 'running', node,
               'schedule', least(coalesce(claim_tick.started_at, now_ts), now_ts)
        FROM claimed c
        RETURNING 1
    )
    SELECT c.job_id, c.definition_version, c.lease_token, c.planned_ns, c.attempt, c.idempotency_key, false,
           0::bigint, c.anchor_ns
    FROM claimed c;
    PERFORM radix._prune_history(job);
END $$;

-- An attempt of a tick that could neither commit nor be recorded as a lease: its tick changed under it
-- (ALTER JOB re-armed the job, and the daemon ended it) or another node took the tick after it rolled back.
-- Its history row says so, as the lease path's 'lease_lost' does, with the attempt's own start and end (as
-- the daemon saw them) and the SQLSTATE it ended with; the tick itself is the state's business.
CREATE FUNCTION radix.record_lost_tick(node text, job uuid, tick_ns bigint, attempt integer, started_at timestamptz,
                                       finished_at timestamptz, sqlstate text)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO radix.radix_system_job_history
        (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind, atomic,
         started_at, finished_at, error)
    SELECT j.job_id, j.definition_version, tick_ns, attempt, job::text || '/' || tick_ns::text, 'lease_lost', node,
           'schedule', true, least(started_at, clock_timestamp()), least(finished_at, clock_timestamp()),
           jsonb_build_object('error', 'PL_JOB_ATTEMPT_FAILED', 'kind', 'lease_lost', 'category', 'connection',
                              'detail', jsonb_build_object('reason', 'tick changed or taken over',
                                                           'sqlstate', sqlstate))
    FROM radix.jobs j WHERE j.job_id = job;
    SELECT radix._prune_history(job);
$$;

-- -- requests wait for a tick in progress ----------------------------------------------------------------

-- A request is installed only while no tick of the job is in progress (its lock free): the tick ends by
-- installing it (end_tick), so a RUN JOB never rolls a running tick back; one left queued otherwise (the
-- tick failed, or its daemon died) is installed by the next radix.find_ticks.
CREATE OR REPLACE FUNCTION radix._promote_request(job uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s radix.radix_system_job_state;
    r radix.job_requests;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = job) THEN
        RETURN false;
    END IF;
    PERFORM FROM radix.tick_locks t WHERE t.job_id = job FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT * INTO s FROM radix.radix_system_job_state WHERE job_id = job;
    IF NOT FOUND OR s.status IN ('running', 'retry_wait') OR s.request_kind IS NOT NULL THEN
        RETURN false;
    END IF;
    DELETE FROM radix.job_requests q
    WHERE (q.job_id, q.planned_ns) = (SELECT o.job_id, o.planned_ns FROM radix.job_requests o
                                      WHERE o.job_id = job ORDER BY o.planned_ns LIMIT 1)
    RETURNING * INTO r;
    UPDATE radix.radix_system_job_state SET
        stash = jsonb_build_object('status', s.status, 'planned_ns', s.planned_ns, 'due_ns', s.due_ns,
                                   'attempt', s.attempt, 'idempotency_key', s.idempotency_key,
                                   'last_error', s.last_error),
        request_kind = r.kind, status = 'scheduled', planned_ns = r.planned_ns,
        due_ns = radix.to_ns(clock_timestamp()), attempt = 0, idempotency_key = NULL,
        updated_at = clock_timestamp()
    WHERE job_id = job;
    PERFORM radix._hint('radix_jobs', job::text);
    RETURN true;
END $$;

-- -- the lease claim leaves the ticks to the finder -------------------------------------------------------

-- As 0012, and with leave_ticks (the daemon's claims) only the lease path's rows: non-atomic and cron jobs,
-- requests, expired leases and dead nodes' claims; the ticks of the one-transaction path are found by
-- radix.find_ticks. Its ticks in progress are passed by anyway: their state rows are locked FOR KEY SHARE.
DROP FUNCTION radix.claim_due(text, integer, boolean, integer, integer);
CREATE FUNCTION radix.claim_due(node text, max_claims integer, with_cron boolean DEFAULT true,
                                max_per_principal integer DEFAULT NULL, lease_seconds integer DEFAULT 300,
                                leave_ticks boolean DEFAULT false)
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
    -- a table lock, not a row lock: no tuple written, no WAL, so a claim that finds nothing commits nothing
    LOCK TABLE radix.claim_serial IN EXCLUSIVE MODE;
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
                  -- the daemon runs the one-transaction path's ticks itself (radix.find_ticks)
                  AND (NOT leave_ticks OR s.via_lease OR s.request_kind IS NOT NULL OR s.status = 'running')
                  AND (s.fence_token IS NULL OR NOT radix.node_alive(s.fence_node))
                  AND (with_cron OR s.request_kind IS NOT NULL OR NOT EXISTS (
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
                         AND s.request_kind IS NULL
                    THEN s.planned_ns + greatest(
                             (now_ns - s.planned_ns) / j.interval_ns
                             - CASE WHEN j.coalesce_ticks THEN 0 ELSE radix.max_missed_ticks() - 1 END,
                             0) * j.interval_ns
                    ELSE s.planned_ns END AS new_planned,
               coalesce(s.request_kind, 'schedule') AS run_kind,
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
                  s.idempotency_key, d.resumed, d.run_kind,
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
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind)
        SELECT c.job_id, c.definition_version, c.planned_ns, c.attempt, c.idempotency_key, 'running', node,
               c.run_kind
        FROM claimed c WHERE NOT c.resumed
        RETURNING 1
    )
    SELECT c.job_id, c.definition_version, c.lease_token, c.planned_ns, c.attempt, c.idempotency_key,
           c.resumed, c.coalesced, c.anchor_ns
    FROM claimed c;

    -- resumed claims: the lost row was closed above; the new attempt gets its own row
    IF resuming THEN
        INSERT INTO radix.radix_system_job_history
            (job_id, definition_version, planned_ns, attempt, idempotency_key, status, node, run_kind)
        SELECT s.job_id, s.definition_version, s.planned_ns, s.attempt, s.idempotency_key, 'running', node,
               coalesce(s.request_kind, 'schedule')
        FROM unnest(picked) AS p(job_id) JOIN radix.radix_system_job_state s ON s.job_id = p.job_id
        WHERE s.lease_node = node AND s.status = 'running' AND s.updated_at = now_ts
          AND NOT EXISTS (SELECT 1 FROM radix.radix_system_job_history h
                          WHERE h.job_id = s.job_id AND h.planned_ns = s.planned_ns
                            AND h.attempt = s.attempt AND h.status = 'running');
    END IF;
    -- keep at most `history` rows per job (WITH (history = N), 256 by default)
    DELETE FROM radix.radix_system_job_history h USING unnest(picked) AS p(job_id)
    WHERE h.job_id = p.job_id AND h.history_id <= (
        SELECT o.history_id FROM radix.radix_system_job_history o WHERE o.job_id = p.job_id
        ORDER BY o.history_id DESC
        OFFSET (SELECT j.history_limit FROM radix.jobs j WHERE j.job_id = p.job_id) LIMIT 1);
END $$;

REVOKE ALL ON FUNCTION radix._running_elsewhere(text, integer[]),
    radix.find_ticks(text, integer, integer, uuid[], integer[]), radix.lease_work_due(text),
    radix.claim_tick(text, uuid, bigint, uuid, integer, boolean, timestamptz),
    radix.record_lost_tick(text, uuid, bigint, integer, timestamptz, timestamptz, text),
    radix.claim_due(text, integer, boolean, integer, integer, boolean) FROM PUBLIC;

-- ===== 0014_finder_plan.sql =====
-- 0014: radix.find_ticks without a scan of every job (issue #14).
--
-- The finder's generic plan (plan_cache_mode = force_generic_plan) estimates its `found` set as the deal's
-- shares times their limits, hundreds of thousands of rows, and joined that set to radix.jobs with a hash
-- join over EVERY row of radix.jobs: most of a find's time with 10,000 jobs, and with 1,000,000 a full scan
-- of the table at every find (290 ms; bench/run.py scale). The join is now a LATERAL probe of the jobs'
-- primary key per tick found (LIMIT 1 keeps it from being flattened back into a join). bench/run.py scale
-- checks the finder's plan for sequential scans, and tests/integration/test_ticks.py reads it.
--
-- The token of each tick is computed inline (radix._tick_token's expression): a SQL function with a SET
-- clause is never inlined, and it was called once per row.

-- find_ticks: up to `max_ticks` ticks for the one-transaction path, due now or within `horizon_ms`, in due
-- order per principal, the principals dealt round-robin (radix._claim_shares, fewest running first).
-- `skip`: the jobs whose ticks this node holds already (queued or running); `mine`: the backend pids of
-- its principal sessions. Each row says how many attempts its principal runs elsewhere (the daemon adds
-- its own and applies the cap when it starts the tick). A tick that another transaction runs (its lock
-- held) is skipped. Writes no tuple: the row locks end with the statement's transaction.
CREATE OR REPLACE FUNCTION radix.find_ticks(node text, max_ticks integer, horizon_ms integer, skip uuid[], mine integer[])
RETURNS TABLE (job_id uuid, definition_version bigint, planned_ns bigint, attempt integer, coalesced bigint,
               anchor_ns bigint, due_in_ms float8, token uuid, principal oid, elsewhere integer)
LANGUAGE plpgsql VOLATILE ROWS 64
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    now_ns bigint := radix.to_ns(clock_timestamp());
    until_ns bigint := now_ns + greatest(coalesce(horizon_ms, 0), 0)::bigint * 1000000;
    ps oid[];
    runs integer[];
    dues bigint[];
BEGIN
    -- a request queued while a tick held its job (radix._promote_request left it) is installed now
    IF EXISTS (SELECT 1 FROM radix.job_requests) THEN
        PERFORM radix._promote_request(q.job_id)
        FROM (SELECT DISTINCT r.job_id FROM radix.job_requests r) q
        JOIN radix.radix_system_job_state s ON s.job_id = q.job_id
        WHERE s.request_kind IS NULL AND s.status NOT IN ('running', 'retry_wait');
    END IF;
    IF coalesce(max_ticks, 0) <= 0
       OR NOT coalesce((SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                        WHERE s.status IN ('scheduled', 'running', 'retry_wait')) <= until_ns, false) THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(l.principal), '{}'), coalesce(array_agg(coalesce(e.running, 0)), '{}'),
           coalesce(array_agg(l.first_due_ns), '{}')
    INTO ps, runs, dues
    FROM radix._principal_load() l
    LEFT JOIN radix._running_elsewhere(node, mine) e ON e.principal = l.principal
    WHERE l.first_due_ns <= until_ns;
    IF cardinality(ps) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH shares AS (
        SELECT sh.principal AS p, sh.share AS n FROM radix._claim_shares(ps, runs, dues, max_ticks, NULL) sh
        WHERE cardinality(ps) > 1
        UNION ALL
        SELECT ps[1], max_ticks WHERE cardinality(ps) = 1
    ), found AS (
        SELECT c.* FROM shares q
        CROSS JOIN LATERAL (
            SELECT s.job_id, s.definition_version, s.planned_ns, s.attempt, s.due_ns, s.status, s.anchor_ns,
                   s.updated_at, s.principal_oid
            FROM radix.radix_system_job_state s
            JOIN radix.tick_locks t ON t.job_id = s.job_id
            WHERE s.principal_oid = q.p
              AND s.status IN ('scheduled', 'retry_wait') AND s.due_ns <= until_ns
              AND s.planned_ns IS NOT NULL AND NOT s.via_lease AND s.request_kind IS NULL
              AND s.job_id <> ALL (coalesce(skip, '{}'))
              AND (s.fence_token IS NULL OR NOT radix.node_alive(s.fence_node))
              -- radix.job_has_live_frame(s.job_id), inlined as claim_due does (a call per candidate row)
              AND NOT EXISTS (
                  SELECT 1 FROM radix.attempt_frames f
                  WHERE f.job_id = s.job_id AND EXISTS (
                      SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start))
            ORDER BY s.due_ns
            LIMIT q.n
            FOR UPDATE OF t SKIP LOCKED) c
    ), decided AS (
        SELECT f.*, j.interval_ns, j.schedule_kind,
               CASE WHEN f.status = 'scheduled' AND j.schedule_kind = 'every' AND f.planned_ns <= now_ns
                    THEN f.planned_ns + greatest(
                             (now_ns - f.planned_ns) / j.interval_ns
                             - CASE WHEN j.coalesce_ticks THEN 0 ELSE radix.max_missed_ticks() - 1 END,
                             0) * j.interval_ns
                    ELSE f.planned_ns END AS run_ns
        -- one probe of the jobs' primary key per tick found (see the header)
        FROM found f CROSS JOIN LATERAL (
            SELECT jj.interval_ns, jj.schedule_kind, jj.coalesce_ticks FROM radix.jobs jj
            WHERE jj.job_id = f.job_id LIMIT 1) j
    )
    SELECT d.job_id, d.definition_version, d.run_ns, d.attempt + 1,
           CASE WHEN d.schedule_kind = 'every' THEN (d.run_ns - d.planned_ns) / d.interval_ns ELSE 0 END,
           d.anchor_ns, (greatest(d.due_ns - now_ns, 0) / 1e6)::float8,
           -- radix._tick_token(d.job_id, d.run_ns, d.attempt, d.updated_at), inlined (see the header)
           encode(substring(sha256(k.secret || uuid_send(d.job_id) || int8send(d.run_ns) || int4send(d.attempt)
                                   || timestamptz_send(d.updated_at)) FROM 1 FOR 16), 'hex')::uuid,
           d.principal_oid,
           coalesce(runs[array_position(ps, d.principal_oid)], 0)
    FROM decided d CROSS JOIN radix.attempt_secret k
    ORDER BY d.due_ns;
END $$;

-- ===== 0015_tick_batches.sql =====
-- 0015: a batch of one-transaction ticks in one transaction (issue #14; engine/batches.py).
--
-- Under a backlog the daemon runs up to eight ticks of one principal, one owner and one procedure in one
-- transaction: `BEGIN; SELECT … FROM radix.run_tick(…); …; COMMIT;` and the connection's clean. Each tick
-- runs in run_tick's own subtransaction (its exception block): begin_tick, the CALL and end_tick commit
-- with the batch or, when any of them fails, roll back alone, and the row run_tick returns says which
-- step failed and how. A tick's procedure and its completion marker still commit together or not at all.

-- run_tick: one tick of a batch, as the tick query runs it (radix.begin_tick, the CALL in its DO block,
-- radix.end_tick), inside an exception block. Returns `failed_at` NULL when the tick is done (its marker
-- written in this transaction), or the step that failed ('begin': nothing ran, e.g. RXT01 when the tick is
-- not this session's; 'call': the procedure failed; 'end': the marker could not be written) with the
-- error's SQLSTATE and message. What failed is rolled back with the subtransaction; the step is kept in a
-- PL/pgSQL variable, which a rollback does not reset and procedure code cannot reach. query_canceled (a
-- statement timeout, a cancel) is not caught: it aborts the whole batch, as it aborts a lone tick.
--
-- SECURITY INVOKER and without SET clauses: the CALL runs as the principal, with the principal's own
-- settings, exactly as the lone tick's DO block does. So the principal's search_path is in force here:
-- every name below is qualified and every value typed. A role switched inside an earlier tick of the
-- batch (SET LOCAL ROLE) is not run: RXT02 at 'begin', and the daemon runs the tick alone after the batch,
-- on a connection whose clean checked its identity.
CREATE FUNCTION radix.run_tick(job uuid, planned_ns bigint, mac text, call text, next_planned_ns bigint,
                               node text, OUT failed_at text, OUT error_sqlstate text, OUT error_message text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    step text := 'begin';
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) SESSION_USER THEN
        RAISE EXCEPTION 'the tick is not run here: the session''s role changed' USING ERRCODE = 'RXT02';
    END IF;
    PERFORM radix.begin_tick(job, planned_ns, mac);
    step := 'call';
    EXECUTE call;
    step := 'end';
    PERFORM radix.end_tick(job, mac, next_planned_ns, node);
EXCEPTION WHEN OTHERS THEN
    failed_at := step;
    GET STACKED DIAGNOSTICS error_sqlstate = RETURNED_SQLSTATE, error_message = MESSAGE_TEXT;
END $$;

GRANT EXECUTE ON FUNCTION radix.run_tick(uuid, bigint, text, text, bigint, text) TO PUBLIC;

-- ===== 0016_batch_end.sql =====
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

-- ===== 0017_batch_start.sql =====
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
