-- Scheduler nodes: registration and liveness.

-- Register the calling session as the control session of `node`. Returns false (and changes nothing)
-- when the node is alive in another session: two processes never share a node id.
CREATE OR REPLACE FUNCTION radix.register_node(node text, host text, os_pid integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
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

-- Liveness of a node, for the views of operators (radix.nodes is the scheduler's only; another user's
-- backend start time is hidden from pg_stat_activity). Says no more than whether a named node runs.
CREATE OR REPLACE FUNCTION radix.node_is_alive(node text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN radix.node_alive(node);

-- How many scheduler nodes are alive in this database (for `radixjobs status`; a count only).
CREATE OR REPLACE FUNCTION radix.live_node_count() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
-- a node is a scheduler process (host and pid): engines of one process under several ids count once
RETURN (SELECT count(DISTINCT coalesce(n.hostname || ':' || n.pid, n.node_id)) FROM radix.nodes n
        WHERE radix.node_alive(n.node_id));

-- A node shutting down hands back the claims it holds whose attempt never began: the tick is due again at
-- once, its attempt not counted. A claim whose attempt began is kept: a frame under its lease token (a
-- non-atomic attempt's begin commits on its own, before its CALL) means effects may have committed, so the
-- tick must run again as itself, with the same key (resumed once the node is gone), never be coalesced away
-- as a tick that did not run.
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
        WHERE s.lease_node = release_claims.node AND s.status = 'running'
          AND NOT EXISTS (SELECT 1 FROM radix.attempt_frames f WHERE f.job_id = s.job_id
                                                                  AND f.lease_token = s.lease_token)
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
