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
