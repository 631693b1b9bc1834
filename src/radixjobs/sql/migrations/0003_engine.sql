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
