-- Who is asking, who may act as whom, and the refusals every path checks.

-- The role a request comes from. Public entry points are SECURITY INVOKER wrappers passing
-- current_user; the definer side accepts it only when the session could become that role itself, so
-- naming another role gains nothing the session does not already have.
CREATE OR REPLACE FUNCTION radix._caller(claimed name) RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

CREATE OR REPLACE FUNCTION radix._check_job_owner(j radix.jobs, caller oid) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    IF NOT radix._acts_for(caller, j.owner_oid) THEN
        RAISE EXCEPTION 'must be owner of job %.%', quote_ident(j.schema_name), quote_ident(j.job_name)
            USING ERRCODE = '42501';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION radix._job_principal_changed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    UPDATE radix.radix_system_job_state SET principal_oid = NEW.principal_oid WHERE job_id = NEW.job_id;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER job_principal_changed AFTER UPDATE OF principal_oid ON radix.jobs
    FOR EACH ROW WHEN (OLD.principal_oid IS DISTINCT FROM NEW.principal_oid)
    EXECUTE FUNCTION radix._job_principal_changed();

-- Admission's checks of who may create the job and run it as whom. The name is serialised on
-- radix.name_locks (a row no ordinary role can lock).
CREATE OR REPLACE FUNCTION radix._check_admission(caller oid, job_parts text[], run_as text,
                                                  if_not_exists boolean)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

-- Is the current role an operator of this database (see above)? A radix_admin created after the install
-- counts as well (looked up by name at every call).
CREATE OR REPLACE FUNCTION radix._is_operator() RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)
    OR pg_has_role(current_user, (SELECT nspowner FROM pg_namespace WHERE nspname = 'radix'), 'USAGE')
    OR coalesce((SELECT pg_has_role(current_user, r.oid, 'USAGE') FROM pg_roles r
                 WHERE r.rolname = 'radix_admin'), false);

-- Whether the current role sees a job or document owned by `owner`: it is an operator, or it has the
-- owner's privileges. The job and document views call this.
CREATE OR REPLACE FUNCTION radix._owner_visible(owner oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN CASE WHEN radix._is_operator() THEN true
            WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE oid = owner) THEN false
            ELSE pg_has_role(current_user, owner, 'USAGE') END;

-- The principal checks of CREATE JOB, for a principal named at ALTER / REPLACE: it exists, `caller` and
-- the job's owner may act as it (the SET rule), it can log in and use PL/pgSQL.
CREATE OR REPLACE FUNCTION radix._check_principal(caller oid, owner oid, run_as text) RETURNS pg_roles
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

CREATE OR REPLACE FUNCTION radix._state_principal() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    SELECT j.principal_oid, radix._takes_lease(j)
    INTO NEW.principal_oid, NEW.via_lease
    FROM radix.jobs j WHERE j.job_id = NEW.job_id;
    RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER state_principal BEFORE INSERT OR UPDATE OF job_id ON radix.radix_system_job_state
    FOR EACH ROW EXECUTE FUNCTION radix._state_principal();

-- Who may act as whom: a superuser as anyone, nobody else as a superuser, a role as itself; otherwise the
-- actor needs SET on the target (MEMBER before PostgreSQL 16). No row when either role is gone. Plain SQL
-- returning a set, without a SET clause: the planner inlines it into the statement that reads it.
CREATE OR REPLACE FUNCTION radix._acting_as(actor oid, target oid) RETURNS TABLE (allowed boolean)
LANGUAGE sql STABLE ROWS 1
BEGIN ATOMIC
    SELECT CASE WHEN a.rolsuper THEN true
                WHEN t.rolsuper THEN false
                WHEN actor = target THEN true
                WHEN current_setting('server_version_num')::integer >= 160000 THEN pg_has_role(actor, target, 'SET')
                ELSE pg_has_role(actor, target, 'MEMBER') END
    FROM pg_roles a, pg_roles t WHERE a.oid = actor AND t.oid = target;
END;

CREATE OR REPLACE FUNCTION radix.may_act_as(actor oid, target oid) RETURNS boolean
LANGUAGE plpgsql STABLE STRICT
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (SELECT m.allowed FROM radix._acting_as(actor, target) m);
END $$;

-- Why the session may not run a job's procedure now as its principal (0: it may): 1 the session is not logged
-- in as the principal; 2 the job's owner may no longer act as it; 3 the procedure is gone or renamed (`proc`
-- NULL); 4 the principal lacks CONNECT on the database, USAGE on the procedure's schema or EXECUTE on it.
-- Every begin of an attempt asks it (begin_atomic, start_tick, start_ticks), inlined like radix._acting_as.
CREATE OR REPLACE FUNCTION radix._refusal(principal oid, owner oid, proc oid, proc_schema oid)
RETURNS TABLE (refused integer)
LANGUAGE sql STABLE ROWS 1
BEGIN ATOMIC
    SELECT CASE
        WHEN (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user) IS DISTINCT FROM principal THEN 1
        WHEN NOT coalesce((SELECT m.allowed FROM radix._acting_as(owner, principal) m), false) THEN 2
        WHEN proc IS NULL THEN 3
        WHEN NOT has_database_privilege(principal, current_database(), 'CONNECT')
             OR NOT has_schema_privilege(principal, proc_schema, 'USAGE')
             OR NOT has_function_privilege(principal, proc, 'EXECUTE') THEN 4
        ELSE 0
    END;
END;

-- A refusal of radix._refusal (1 to 4) as the error each begin reports (start_tick, start_ticks) or raises
-- (begin_atomic): its SQLSTATE and message, `signature` the procedure's; no row for 0 (the attempt may run).
-- Plain SQL without a SET clause, inlined like radix._refusal.
CREATE OR REPLACE FUNCTION radix._refusal_error(refused integer, signature text)
RETURNS TABLE (code text, message text)
LANGUAGE sql STABLE ROWS 1
BEGIN ATOMIC
    SELECT CASE WHEN refused = 3 THEN '42883' ELSE '42501' END,
           CASE refused
               WHEN 1 THEN 'permission denied: the attempt is not logged in as its principal'
               WHEN 2 THEN 'permission denied: the job owner may no longer act as its principal'
               WHEN 3 THEN format('procedure %s no longer exists', signature)
               ELSE format('permission denied for procedure %s', signature)
           END
    WHERE refused BETWEEN 1 AND 4;
END;
