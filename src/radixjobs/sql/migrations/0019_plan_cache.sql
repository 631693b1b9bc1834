-- 0019: the routines a find, a claim and a tick call are PL/pgSQL, so a session plans their statements
-- once on every supported PostgreSQL.
--
-- Before PostgreSQL 18, a SQL-language function that is not inlined (these all have a SET clause, which
-- forbids inlining) parses and plans its body again at every call; PostgreSQL 18 keeps those plans as it
-- keeps PL/pgSQL's. On 15 that made each find several times the server time it takes on 18, on the path of
-- every tick (docs/benchmarks.md, per PostgreSQL version). PL/pgSQL keeps each statement's plan for the
-- session (generic or custom as the plan cache decides), on 14 as on 18. The bodies, volatility, security
-- and grants are unchanged; each still pins search_path and jit (0018_jit_off.sql).
--
-- Converted: the finder's helpers (_principal_load, _running_elsewhere, _claim_shares, lease_work_due,
-- node_alive, job_has_live_frame), a tick's (_prune_history, _tick_token, _session_key, _attempt_mac,
-- _tick_frame_mac, may_act_as), what a job's code calls (current_job_id, current_job_attempt,
-- current_job_scheduled_at, current_idempotency_key), a principal session's start (attempt_session) and
-- an engine's end (release_claims). tests/integration/test_batches.py runs a lone tick
-- and a batch with track_functions on and checks that no SQL-language routine with settings is called.

CREATE OR REPLACE FUNCTION radix._principal_load()
RETURNS TABLE (principal oid, first_due_ns bigint, running integer)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN QUERY
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
    WHERE k.p IS NOT NULL;
END $$;

CREATE OR REPLACE FUNCTION radix._running_elsewhere(node text, mine integer[])
RETURNS TABLE (principal oid, running integer)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN QUERY
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
    GROUP BY x.p;
END $$;

CREATE OR REPLACE FUNCTION radix._claim_shares(principals oid[], running integer[], first_due bigint[],
                                               budget integer, cap integer)
RETURNS TABLE (principal oid, share integer)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT x.p, count(*)::integer
    FROM (SELECT u.p
          FROM unnest(principals, _claim_shares.running, first_due) AS u(p, n, due)
          CROSS JOIN LATERAL generate_series(1, least(budget, coalesce(cap - u.n, budget))) AS g(i)
          ORDER BY u.n + g.i, u.due, u.p
          LIMIT greatest(budget, 0)) x
    GROUP BY x.p;
END $$;

CREATE OR REPLACE FUNCTION radix.node_alive(node text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM radix.nodes n
                   WHERE n.node_id = node_alive.node AND EXISTS (
                       SELECT 1 FROM pg_stat_get_activity(n.backend_pid) a WHERE a.backend_start = n.backend_start));
END $$;

CREATE OR REPLACE FUNCTION radix.lease_work_due(node text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN coalesce((SELECT min(s.due_ns) FROM radix.radix_system_job_state s
                     WHERE s.status IN ('scheduled', 'running', 'retry_wait')
                       AND (s.via_lease OR s.request_kind IS NOT NULL OR s.status = 'running'))
                    <= radix.to_ns(clock_timestamp()), false)
        OR EXISTS (SELECT 1 FROM radix.radix_system_job_state s
                   WHERE s.status = 'running' AND s.lease_node <> node AND NOT radix.node_alive(s.lease_node));
END $$;

CREATE OR REPLACE FUNCTION radix.job_has_live_frame(job uuid) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM radix.attempt_frames f
                   WHERE f.job_id = job_has_live_frame.job AND EXISTS (
                       SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start));
END $$;

CREATE OR REPLACE FUNCTION radix._prune_history(job uuid) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    DELETE FROM radix.radix_system_job_history h
    WHERE h.job_id = _prune_history.job AND h.history_id <= (
        SELECT o.history_id FROM radix.radix_system_job_history o WHERE o.job_id = _prune_history.job
        ORDER BY o.history_id DESC
        OFFSET (SELECT j.history_limit FROM radix.jobs j WHERE j.job_id = _prune_history.job) LIMIT 1);
END $$;

CREATE OR REPLACE FUNCTION radix._tick_token(job uuid, planned_ns bigint, attempt integer,
                                             updated_at timestamptz) RETURNS uuid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (SELECT encode(substring(sha256(k.secret || uuid_send(_tick_token.job) || int8send(_tick_token.planned_ns)
                                           || int4send(_tick_token.attempt) || timestamptz_send(_tick_token.updated_at))
                                    FROM 1 FOR 16), 'hex')::uuid
            FROM radix.attempt_secret k);
END $$;

CREATE OR REPLACE FUNCTION radix._session_key() RETURNS bytea
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (SELECT sha256(k.secret || int4send(pg_backend_pid()) || timestamptz_send(a.backend_start))
            FROM radix.attempt_secret k, pg_stat_get_activity(pg_backend_pid()) a);
END $$;

CREATE OR REPLACE FUNCTION radix._attempt_mac(token uuid) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN encode(sha256(radix._session_key() || uuid_send(token)), 'hex');
END $$;

CREATE OR REPLACE FUNCTION radix._tick_frame_mac(frame text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (SELECT encode(sha256(k.secret || sha256(k.secret || convert_to('radix.tick/' || _tick_frame_mac.frame,
                                                                           'UTF8'))), 'hex')
            FROM radix.attempt_secret k);
END $$;

CREATE OR REPLACE FUNCTION radix.may_act_as(actor oid, target oid) RETURNS boolean
LANGUAGE plpgsql STABLE STRICT
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (SELECT CASE WHEN a.rolsuper THEN true
                        WHEN t.rolsuper THEN false
                        WHEN may_act_as.actor = may_act_as.target THEN true
                        WHEN current_setting('server_version_num')::integer >= 160000
                            THEN pg_has_role(may_act_as.actor, may_act_as.target, 'SET')
                        ELSE pg_has_role(may_act_as.actor, may_act_as.target, 'MEMBER') END
            FROM pg_roles a, pg_roles t WHERE a.oid = may_act_as.actor AND t.oid = may_act_as.target);
END $$;

CREATE OR REPLACE FUNCTION radix.current_job_id() RETURNS uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (radix._frame()).job_id;
END $$;

CREATE OR REPLACE FUNCTION radix.current_job_attempt() RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (radix._frame()).attempt;
END $$;

CREATE OR REPLACE FUNCTION radix.current_job_scheduled_at() RETURNS timestamptz
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN radix.from_ns((radix._frame()).planned_ns);
END $$;

CREATE OR REPLACE FUNCTION radix.current_idempotency_key() RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (radix._frame()).idempotency_key;
END $$;

CREATE OR REPLACE FUNCTION radix.attempt_session() RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN encode(radix._session_key(), 'hex');
END $$;

CREATE OR REPLACE FUNCTION radix.release_claims(node text) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    n integer;
BEGIN
    WITH released AS (
        UPDATE radix.radix_system_job_state s SET status = CASE WHEN s.attempt > 1 THEN 'retry_wait'
                                                               ELSE 'scheduled' END,
            attempt = s.attempt - 1, due_ns = radix.to_ns(clock_timestamp()),
            lease_node = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = clock_timestamp()
        WHERE s.lease_node = release_claims.node AND s.status = 'running' AND NOT radix.job_has_live_frame(s.job_id)
        RETURNING s.job_id, s.planned_ns, s.attempt + 1 AS attempt
    ), closed AS (
        UPDATE radix.radix_system_job_history h SET status = 'released', finished_at = clock_timestamp()
        FROM released r WHERE h.job_id = r.job_id AND h.planned_ns = r.planned_ns
          AND h.attempt = r.attempt AND h.status = 'running'
        RETURNING 1
    )
    SELECT count(*)::integer INTO n FROM released;
    RETURN n;
END $$;
