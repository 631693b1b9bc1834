-- CSP services: which roles a document may name a service for.

-- May a document written by `writer` that runs as `principal` use `service`? Roles that no longer
-- exist count as nothing.
CREATE OR REPLACE FUNCTION radix._service_usable(service text, writer oid, principal oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN coalesce((SELECT rolsuper FROM pg_roles WHERE oid = writer), false)
    OR (EXISTS (SELECT 1 FROM pg_roles WHERE oid = principal)
        AND EXISTS (SELECT 1 FROM radix.service_grants g
                    WHERE g.service = _service_usable.service
                      AND CASE WHEN g.grantee = 0 THEN true
                               WHEN NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = g.grantee) THEN false
                               ELSE pg_has_role(principal, g.grantee, 'USAGE') END));

-- A grantee given as a role name, or PUBLIC (0); raises for an unknown role.
CREATE OR REPLACE FUNCTION radix._service_grantee(grantee name) RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
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
CREATE OR REPLACE FUNCTION radix._forget_dropped_grantees() RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
    DELETE FROM radix.service_grants g
    WHERE g.grantee <> 0 AND NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = g.grantee)
$$;

-- The operator's verbs. true: the grant was added (grant) or removed (revoke); false: nothing changed.
CREATE OR REPLACE FUNCTION radix.grant_service(service text, grantee name) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
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
COMMENT ON FUNCTION radix.grant_service(text, name) IS
    'Allow documents whose RUN_AS has the privileges of GRANTEE (a role, or PUBLIC) to name CSP service SERVICE.';

CREATE OR REPLACE FUNCTION radix.revoke_service(service text, grantee name) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
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
COMMENT ON FUNCTION radix.revoke_service(text, name) IS
    'Withdraw a grant made by radix.grant_service; runs already admitted fail at their next start.';

-- The grants a role may see: all of them for the operator (a superuser, or a role with the privileges
-- of the radix schema's owner); for anyone else only the grants it benefits from (PUBLIC, or a role whose
-- privileges it has), so no role learns the names of services it may not use.
CREATE OR REPLACE FUNCTION radix._service_grant_visible(grantee oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN true
            WHEN pg_has_role(current_user, (SELECT nspowner FROM pg_namespace WHERE nspname = 'radix'), 'USAGE')
                 THEN true
            WHEN grantee = 0 THEN true
            WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE oid = grantee) THEN false
            ELSE pg_has_role(current_user, grantee, 'USAGE') END;
