-- CRON_TABLE documents: checked, applied, and run by the document scheduler.

CREATE OR REPLACE FUNCTION radix._doc_present(v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE
RETURN v IS NOT NULL AND jsonb_typeof(v) <> 'null';

-- The task key of a document: an integer NUM as its digits, a string NUM as given; NULL when invalid.
CREATE OR REPLACE FUNCTION radix.document_num(doc jsonb) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN (SELECT CASE
          WHEN jsonb_typeof(n) = 'number' AND n::text ~ '^-?[0-9]{1,100}$' THEN n::text
          WHEN jsonb_typeof(n) = 'string' AND btrim(n #>> '{}') <> '' AND length(n #>> '{}') <= 100
               THEN n #>> '{}'
        END
        FROM (SELECT CASE WHEN jsonb_typeof(doc) = 'object' AND jsonb_typeof(doc->'props') = 'object'
                          THEN doc->'props'->'NUM' END AS n) x);

-- Is `name` a function name: `name` or `schema.name`, PostgreSQL identifier rules, each part <= 63 bytes?
CREATE OR REPLACE FUNCTION radix._doc_function_name_ok(name text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    parts text[];
BEGIN
    parts := parse_ident(name);
    RETURN cardinality(parts) IN (1, 2) AND (SELECT bool_and(octet_length(p) <= 63) FROM unnest(parts) p);
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END $$;

CREATE OR REPLACE FUNCTION radix._doc_json_text_ok(s text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    PERFORM s::jsonb;
    RETURN true;
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END $$;

CREATE OR REPLACE FUNCTION radix._doc_timestamp_ok(s text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
SET jit = off
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
-- A status is CRON_TABLE_ACTIVE or any other CRON_TABLE_<NAME>, which disables the task (the seed: "any
-- status but ACTIVE"); radix._doc_write stores the latter as PASSIVE unless it is PASSIVE or ERROR.
CREATE OR REPLACE FUNCTION radix.document_problems(doc jsonb) RETURNS text[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
    ELSIF jsonb_typeof(v) <> 'string' OR v #>> '{}' !~ '^CRON_TABLE_[A-Z0-9_]+$' THEN
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

CREATE OR REPLACE FUNCTION radix._doc_prefix(doc jsonb, pos integer, single boolean) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN CASE WHEN single THEN coalesce('NUM ' || radix.document_num(doc) || ': ', '')
            ELSE 'document ' || pos || coalesce(' (NUM ' || radix.document_num(doc) || ')', '') || ': ' END;

-- Write one checked document (its key is locked by the caller). A disabling status other than PASSIVE and
-- ERROR (CRON_TABLE_DISABLED…) is stored as PASSIVE: the table holds the statuses the scheduler knows.
-- Identical definition and stored status: nothing changes. Otherwise the version goes up; a status set
-- back to ACTIVE re-arms the task (error counter, error text and NEXT_RUN cleared: due at FIRST_RUN, or
-- now). Run state is kept.
CREATE OR REPLACE FUNCTION radix._doc_write(caller oid, doc jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
SET jit = off
AS $$
DECLARE
    maintained text[] := ARRAY['SYS_PROCESS_ID', 'COUNT_ERROR', 'LAST_RUN', 'NEXT_RUN', 'DAILY_START_TIME',
                               'DAILY_END_TIME', 'ERROR_TEXT'];
    key text := radix.document_num(doc);
    principal pg_roles;
    new_props jsonb;
    new_status text := CASE WHEN doc->>'status' IN ('CRON_TABLE_ACTIVE', 'CRON_TABLE_ERROR') THEN doc->>'status'
                            ELSE 'CRON_TABLE_PASSIVE' END;
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

-- Apply documents as `creator`: every NUM is locked on radix.name_locks (a row no ordinary role can lock),
-- with bounded waits; the documents are checked and written all or none.
CREATE OR REPLACE FUNCTION radix._apply_documents(creator name, docs jsonb, single boolean) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
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


-- Public entry points (SECURITY INVOKER): the calling role is current_user at the call site.
-- apply_document returns {"num", "action": created | updated | unchanged, "version", "ignored": [...]}.
CREATE OR REPLACE FUNCTION radix.apply_document(doc jsonb) RETURNS jsonb LANGUAGE sql VOLATILE
RETURN radix._apply_documents(current_user, jsonb_build_array(doc), true) -> 0;

CREATE OR REPLACE FUNCTION radix.apply_documents(docs jsonb) RETURNS jsonb LANGUAGE sql VOLATILE
RETURN radix._apply_documents(current_user,
                              CASE WHEN jsonb_typeof(docs) = 'object' THEN jsonb_build_array(docs) ELSE docs END,
                              jsonb_typeof(docs) = 'object');

-- The ACTIVE tasks the decision table must look at: due ones, and ones with a recorded process.
CREATE OR REPLACE FUNCTION radix.doc_candidates(at_ts timestamptz, my_node text, in_flight bigint[])
RETURNS TABLE (num text, version bigint, due_at timestamptz, sys_process_id bigint, process_status text,
               process_live boolean, process_error text, now_ts timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
CREATE OR REPLACE FUNCTION radix.doc_next_due_in(at_ts timestamptz, my_node text, in_flight bigint[]) RETURNS float8
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
CREATE OR REPLACE FUNCTION radix.doc_start(task text, expected_process bigint, my_node text, at_ts timestamptz)
RETURNS TABLE (process_id bigint, kind text, target text, params jsonb, principal name, refusal text,
               started_at timestamptz, version bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
CREATE OR REPLACE FUNCTION radix.doc_record(process bigint, succeeded boolean, error text, at_ts timestamptz)
RETURNS timestamptz
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
    UPDATE radix.sys_processes SET status = CASE WHEN succeeded THEN 'completed' ELSE 'failed' END,
        error_text = error, finished_at = coalesce(at_ts, clock_timestamp())
    WHERE id = process AND status = 'running'
    RETURNING finished_at
$$;

-- What the finish of `process` needs; no row when the task no longer records that process.
CREATE OR REPLACE FUNCTION radix.doc_finish_state(task text, process bigint)
RETURNS TABLE (version bigint, status text, props jsonb, count_error integer, daily_start_time timestamptz,
               principal name, refusal text, process_status text, process_error text,
               process_finished_at timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
CREATE OR REPLACE FUNCTION radix.doc_finish(task text, process bigint, expected_version bigint, new_status text,
                                 next_run timestamptz, count_error integer, error text, at_ts timestamptz)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
CREATE OR REPLACE FUNCTION radix.doc_release_inactive(my_node text, in_flight bigint[], at_ts timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

-- What `caller` may not do with a structurally valid document: ownership of an existing document (the
-- owner's privileges), RUN_AS (exists, may act as it, can log in) and its CSP service (granted).
-- Returns (problem, is_permission) rows.
CREATE OR REPLACE FUNCTION radix._doc_access_problems(caller oid, doc jsonb)
RETURNS TABLE (problem text, permission boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
SET jit = off
RETURN radix._owner_visible(owner);

-- Why the task may not run now (NULL: it may): checked at every start (before any code runs) and finish.
-- The service refusal names nothing: the document's owner knows what it named.
CREATE OR REPLACE FUNCTION radix._doc_refusal(c radix.cron_table) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

-- A document's props are bounded (the scheduler reads them for every run): a trigger, so that every write
-- is checked whatever wrote it; the apply fails as a whole.
CREATE OR REPLACE FUNCTION radix._bound_document_props() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
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

CREATE OR REPLACE TRIGGER cron_table_props_bound BEFORE INSERT OR UPDATE OF props ON radix.cron_table
    FOR EACH ROW EXECUTE FUNCTION radix._bound_document_props();

CREATE OR REPLACE FUNCTION radix._notify_document() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM radix._hint('radix_documents', OLD.num);
    ELSE
        PERFORM radix._hint('radix_documents', NEW.num);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER "trgCronTableChanged" AFTER INSERT OR UPDATE OR DELETE ON radix.cron_table
    FOR EACH ROW EXECUTE FUNCTION radix._notify_document();

CREATE OR REPLACE FUNCTION radix._notify_process() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    PERFORM radix._hint('radix_documents', NEW.task_num);
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER "trgProcessChanged" AFTER INSERT OR UPDATE OF status ON radix.sys_processes
    FOR EACH ROW EXECUTE FUNCTION radix._notify_process();