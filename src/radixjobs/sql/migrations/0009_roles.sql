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
