-- The public API's allow-list: what PUBLIC may use in schema radix. Applied last on every install, after
-- every routine and view: nothing in radix is usable by PUBLIC unless it is named here. Each SECURITY DEFINER
-- routine below checks who calls it (radix._caller, radix._check_principal); the SECURITY INVOKER ones run
-- with the caller's own rights. The tables are radix's alone: roles read them through the views, which
-- show each role its own rows.

REVOKE ALL ON SCHEMA radix FROM PUBLIC;
GRANT USAGE ON SCHEMA radix TO PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA radix FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA radix FROM PUBLIC;
REVOKE ALL ON ALL ROUTINES IN SCHEMA radix FROM PUBLIC;

-- basics.sql
GRANT EXECUTE ON FUNCTION
    radix.to_ns(timestamp with time zone),
    radix.from_ns(bigint),
    radix.max_argument_bytes(),
    radix.max_document_bytes(),
    radix._canonical_text(anyelement),
    radix._hint(text,text),
    radix.schema_version(),
    radix.routine_checksum(),
    radix.max_timeout_ms(),
    radix.max_requested_ticks(),
    radix.max_missed_ticks()
    TO PUBLIC;

-- identity.sql
GRANT EXECUTE ON FUNCTION
    radix._is_operator(),
    radix._owner_visible(oid),
    radix.may_act_as(oid,oid)
    TO PUBLIC;

-- tokens.sql
GRANT EXECUTE ON FUNCTION
    radix.attempt_session()
    TO PUBLIC;

-- groups.sql
GRANT EXECUTE ON FUNCTION
    radix._acts_for(oid,oid),
    radix._group_max_running(jsonb),
    radix._create_job_group(name,text,jsonb,boolean),
    radix.create_job_group(text,jsonb,boolean),
    radix._alter_job_group(name,text,jsonb,text[]),
    radix.alter_job_group(text,jsonb,text[]),
    radix._drop_job_group(name,text,boolean),
    radix.drop_job_group(text,boolean)
    TO PUBLIC;

-- admission.sql
GRANT EXECUTE ON FUNCTION
    radix._split_qualified(text,text),
    radix._constant_sql(jsonb),
    radix._normalise_arguments(jsonb),
    radix._create_probes(text,text),
    radix._resolve_call(text,text,jsonb),
    radix._procedure_parameters(oid),
    radix._probe_parameters(oid),
    radix._admit(name,text,text,boolean),
    radix._check_argument_size(jsonb),
    radix._check_output_arguments(oid,jsonb),
    radix._check_timeout(numeric,text),
    radix._bind_arguments(oid,jsonb),
    radix._option_names(),
    radix._option_interval_ns(text,jsonb),
    radix._normalise_options(jsonb)
    TO PUBLIC;

-- hooks.sql
GRANT EXECUTE ON FUNCTION
    radix._resolve_hook(jsonb)
    TO PUBLIC;

-- jobs.sql
GRANT EXECUTE ON FUNCTION
    radix._job_dependents(name,text),
    radix.drop_job(text,boolean,boolean),
    radix._drop_job(name,text,boolean,boolean),
    radix._change_job(name,text,boolean,jsonb,text,text,jsonb,jsonb,text[],text),
    radix.alter_job(text,boolean,jsonb,text,text,jsonb,jsonb,text[],text),
    radix._create_job(name,text,jsonb,text,text,jsonb,boolean,boolean,jsonb),
    radix.create_job(text,jsonb,text,text,jsonb,boolean,boolean,integer,interval,jsonb,boolean)
    TO PUBLIC;

-- requests.sql
GRANT EXECUTE ON FUNCTION
    radix._request_ticks(name,text,bigint[],text),
    radix.run_job(text),
    radix._job_anchor_ns(name,text),
    radix.backfill_job(text,timestamp with time zone,timestamp with time zone,bigint[])
    TO PUBLIC;

-- nodes.sql
GRANT EXECUTE ON FUNCTION
    radix.node_is_alive(text),
    radix.live_node_count(),
    radix.node_alive(text)
    TO PUBLIC;

-- finder.sql
GRANT EXECUTE ON FUNCTION
    radix.job_has_live_frame(uuid)
    TO PUBLIC;

-- tick.sql
GRANT EXECUTE ON FUNCTION
    radix.run_tick(uuid,bigint,integer,text,text,bigint,text),
    radix.start_tick(uuid,bigint,text),
    radix.end_tick(uuid,bigint,integer,text,bigint,text)
    TO PUBLIC;

-- batch.sql
GRANT EXECUTE ON FUNCTION
    radix.end_ticks(uuid[],bigint[],integer[],text[],bigint[],boolean[],text),
    radix.start_ticks(uuid[],bigint[],text[]),
    radix.run_ticks(uuid[],bigint[],integer[],text[],text[],bigint[],text)
    TO PUBLIC;

-- lease.sql
GRANT EXECUTE ON FUNCTION
    radix.begin_atomic(uuid,text),
    radix.end_atomic(uuid,text,bigint),
    radix.begin_attempt(uuid,uuid),
    radix.end_attempt(uuid,uuid,bigint,boolean)
    TO PUBLIC;

-- frames.sql
GRANT EXECUTE ON FUNCTION
    radix.once(),
    radix.current_job_id(),
    radix.current_job_attempt(),
    radix.current_job_scheduled_at(),
    radix.current_idempotency_key(),
    radix.current_arguments(bigint)
    TO PUBLIC;

-- services.sql
GRANT EXECUTE ON FUNCTION
    radix._service_grant_visible(oid)
    TO PUBLIC;

-- documents.sql
GRANT EXECUTE ON FUNCTION
    radix._doc_present(jsonb),
    radix.document_num(jsonb),
    radix._doc_function_name_ok(text),
    radix._doc_json_text_ok(text),
    radix._doc_timestamp_ok(text),
    radix.document_problems(jsonb),
    radix._doc_prefix(jsonb,integer,boolean),
    radix.apply_document(jsonb),
    radix.apply_documents(jsonb),
    radix._doc_visible(oid),
    radix._apply_documents(name,jsonb,boolean)
    TO PUBLIC;

-- views.sql
GRANT EXECUTE ON FUNCTION
    radix._job_exists(text)
    TO PUBLIC;

GRANT SELECT ON radix.job_overview, radix.job_history, radix.job_group_overview, radix.document_overview, radix.document_processes,
    radix.csp_services, radix.node_overview TO PUBLIC;
