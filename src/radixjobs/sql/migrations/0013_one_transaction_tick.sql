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
