-- Dependencies: jobs that run after other jobs (SCHEDULE AFTER upstream [SUCCEEDS | FAILS | COMPLETES] [AND …]).
--
-- A dependent job has no clock of its own. Each tick of an upstream that ends for good (after its retries) as
-- an edge names queues one tick of the dependent with the same planned time, as a request of kind 'after'
-- (radix.job_requests), in the same transaction as the upstream's marker (radix._fire_dependents, called
-- where the state advances: radix._advance and radix.end_atomic). So a chain shares one logical tick, its key
-- `<dependent-id>/<planned-ns>`, and no crash loses or doubles an edge: the upstream's marker and the
-- dependent's request commit together or not at all, and a request is queued once per (job, planned time).
-- A fan-in (AND) queues it when the last upstream arrives: radix.edge_fires holds the ones already there,
-- and its upsert serialises two upstreams ending at once (the second waits for the first's commit, then sees
-- its row).
--
-- Which ticks flow down: the scheduled ones, backfill ticks and a dependent's own ('after'); a RUN JOB runs
-- its job alone. Missed ticks (start deadline) and ticks still retrying do not end, so do not fire.
--
-- An upstream's ticks always take the lease path (its state row's via_lease, radix._takes_lease): the
-- markers written there are the only ones that fire dependents. The edges of a job change only while its row
-- is locked (FOR NO KEY UPDATE: by ALTER, CREATE OR REPLACE, DROP, or a CREATE's own new row), and an
-- admission locks every job up the chain from its new upstreams before it looks for a cycle, so two
-- admissions cannot close a cycle between them: the second waits for the first, then sees its edges.
--
-- Who may depend on what: a job may run after a job only when its owner may act for the upstream's owner
-- (radix._acts_for, the rule of a job's owner), as the upstream's own owner could. An upstream the caller
-- does not see does not exist for it. The rule is checked again when an edge fires: an edge whose owner lost
-- the right does not fire. So no role triggers another owner's job, nor learns when it runs.

-- Does a job take the lease path for every tick? Procedures that commit inside, cron schedules (planned by
-- the daemon), jobs in a group (the cap is counted in claims), dependents and upstreams (the edges fire
-- where the lease path writes its marker). The one rule of the state row's via_lease.
CREATE OR REPLACE FUNCTION radix._takes_lease(j radix.jobs) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN j.non_atomic OR j.schedule_kind IN ('cron', 'after') OR j.group_id IS NOT NULL
    OR EXISTS (SELECT 1 FROM radix.job_edges e WHERE e.upstream_id = j.job_id);

-- An AFTER schedule's upstreams as given ([{"job": "etl.a", "on": "succeeds"}, …]), checked: each a
-- qualified job name, once, with SUCCEEDS (the default), FAILS or COMPLETES; at most 64.
CREATE OR REPLACE FUNCTION radix._normalise_after(after jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    e jsonb;
    parts text[];
    cond text;
    seen text[] := '{}';
    out jsonb := '[]';
BEGIN
    IF jsonb_typeof(after) IS DISTINCT FROM 'array' OR jsonb_array_length(after) = 0 THEN
        RAISE EXCEPTION 'SCHEDULE AFTER needs at least one upstream job' USING ERRCODE = '22023';
    END IF;
    IF jsonb_array_length(after) > 64 THEN
        RAISE EXCEPTION 'SCHEDULE AFTER takes at most 64 upstream jobs' USING ERRCODE = '54000';
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(after) x LOOP
        IF jsonb_typeof(e) = 'string' THEN
            e := jsonb_build_object('job', e);
        END IF;
        IF jsonb_typeof(e) IS DISTINCT FROM 'object' OR jsonb_typeof(e->'job') IS DISTINCT FROM 'string' THEN
            RAISE EXCEPTION 'an upstream of SCHEDULE AFTER must be {"job": "schema.name", "on": …}'
                USING ERRCODE = '22023';
        END IF;
        parts := radix._split_qualified(e->>'job', 'job');
        cond := lower(coalesce(e->>'on', 'succeeds'));
        IF cond NOT IN ('succeeds', 'fails', 'completes') THEN
            RAISE EXCEPTION 'upstream % must be followed by SUCCEEDS, FAILS or COMPLETES, not %',
                e->>'job', quote_literal(e->>'on') USING ERRCODE = '22023';
        END IF;
        IF quote_ident(parts[1]) || '.' || quote_ident(parts[2]) = ANY (seen) THEN
            RAISE EXCEPTION 'upstream %.% is named twice', quote_ident(parts[1]), quote_ident(parts[2])
                USING ERRCODE = '42710';
        END IF;
        seen := seen || (quote_ident(parts[1]) || '.' || quote_ident(parts[2]));
        out := out || jsonb_build_object('schema', parts[1], 'name', parts[2], 'on', cond);
    END LOOP;
    RETURN out;
END $$;

-- Set the edges of job `j` (a row already written, locked by the caller) to `after` (radix._normalise_after's;
-- NULL: none), as `caller` admits them: each upstream exists and the caller may act for its owner, none is `j`
-- itself or runs after it (a cycle: every job up the chain is locked first, each wait bounded). The upstreams
-- that gained or lost their last dependent change path
-- (radix._takes_lease); their state row's updated_at moves, so a tick of theirs found on the one-transaction
-- path before now is no longer as found and runs on the lease path. Returns whether the edges changed.
CREATE OR REPLACE FUNCTION radix._set_edges(j radix.jobs, after jsonb, caller oid) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    prior_timeout text;
    wanted radix.job_edges[] := '{}';
    e jsonb;
    u radix.jobs;
    before uuid[];
    locked uuid[] := ARRAY[j.job_id];
    todo uuid[];
    cycle text;
BEGIN
    IF after IS NULL AND NOT EXISTS (SELECT 1 FROM radix.job_edges x WHERE x.job_id = j.job_id) THEN
        RETURN false;  -- no edges before or after
    END IF;
    prior_timeout := radix._bound_lock_wait();
    FOR e IN SELECT x FROM jsonb_array_elements(coalesce(after, '[]')) x LOOP
        SELECT * INTO u FROM radix.jobs WHERE schema_name = e->>'schema' AND job_name = e->>'name';
        IF NOT FOUND OR NOT radix._acts_for(caller, u.owner_oid) THEN
            RAISE EXCEPTION 'job %.% does not exist', quote_ident(e->>'schema'), quote_ident(e->>'name')
                USING ERRCODE = '42704', HINT = 'A job runs after jobs whose owner''s privileges its owner has.';
        END IF;
        IF u.job_id = j.job_id THEN
            RAISE EXCEPTION 'job %.% cannot run after itself', quote_ident(j.schema_name), quote_ident(j.job_name)
                USING ERRCODE = '42P17';
        END IF;
        wanted := wanted || ROW(j.job_id, u.job_id, e->>'on')::radix.job_edges;
    END LOOP;
    -- lock the upstreams and every job up the chain from them, until no new one appears
    LOOP
        WITH RECURSIVE up (job_id) AS (
            SELECT w.upstream_id FROM unnest(wanted) w
            UNION
            SELECT x.upstream_id FROM radix.job_edges x JOIN up ON x.job_id = up.job_id
        )
        SELECT array_agg(up.job_id ORDER BY up.job_id) INTO todo FROM up WHERE NOT up.job_id = ANY (locked);
        EXIT WHEN todo IS NULL;
        BEGIN
            PERFORM FROM radix.jobs x WHERE x.job_id = ANY (todo) ORDER BY x.job_id FOR NO KEY UPDATE;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'a job that job %.% would run after is being changed by another transaction; try again',
                quote_ident(j.schema_name), quote_ident(j.job_name) USING ERRCODE = '55P03';
        END;
        locked := locked || todo;
    END LOOP;
    PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    IF EXISTS (SELECT 1 FROM unnest(wanted) w WHERE NOT EXISTS (SELECT 1 FROM radix.jobs x
                                                                  WHERE x.job_id = w.upstream_id)) THEN
        RAISE EXCEPTION 'a job that job %.% would run after was dropped meanwhile', quote_ident(j.schema_name),
            quote_ident(j.job_name) USING ERRCODE = '42704';
    END IF;
    IF ARRAY(SELECT x FROM radix.job_edges x WHERE x.job_id = j.job_id ORDER BY x.upstream_id)
       = ARRAY(SELECT x FROM unnest(wanted) x ORDER BY x.upstream_id) THEN
        RETURN false;
    END IF;
    -- a cycle: an upstream that runs after `j`, directly or down a chain
    WITH RECURSIVE down (job_id, path) AS (
        SELECT x.job_id, ARRAY[j.job_id, x.job_id] FROM radix.job_edges x WHERE x.upstream_id = j.job_id
        UNION
        SELECT x.job_id, d.path || x.job_id FROM radix.job_edges x JOIN down d ON x.upstream_id = d.job_id
        WHERE NOT x.job_id = ANY (d.path)
    )
    SELECT string_agg(radix._job_name_for(caller, k), ' → ' ORDER BY o.n)
    INTO cycle
    FROM (SELECT d.path FROM down d WHERE d.job_id IN (SELECT w.upstream_id FROM unnest(wanted) w) LIMIT 1) c,
         unnest(c.path) WITH ORDINALITY AS o(job_id, n) JOIN radix.jobs k ON k.job_id = o.job_id;
    IF cycle IS NOT NULL THEN
        RAISE EXCEPTION 'job %.% cannot run after a job that runs after it', quote_ident(j.schema_name),
            quote_ident(j.job_name) USING ERRCODE = '42P17', DETAIL = format('The chain: %s, back to the first.', cycle);
    END IF;
    before := ARRAY(SELECT x.upstream_id FROM radix.job_edges x WHERE x.job_id = j.job_id);
    DELETE FROM radix.job_edges x WHERE x.job_id = j.job_id;
    INSERT INTO radix.job_edges SELECT * FROM unnest(wanted);
    PERFORM radix._path_changed(k) FROM radix.jobs k
    WHERE k.job_id = ANY (before || ARRAY(SELECT w.upstream_id FROM unnest(wanted) w));
    RETURN true;
END $$;

-- A job's state row follows radix._takes_lease; a change fences a tick found on the one-transaction path
-- (its token derives from updated_at).
CREATE OR REPLACE FUNCTION radix._path_changed(j radix.jobs) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
BEGIN ATOMIC
    UPDATE radix.radix_system_job_state SET via_lease = radix._takes_lease(j), updated_at = clock_timestamp()
    WHERE job_id = j.job_id AND via_lease IS DISTINCT FROM radix._takes_lease(j);
END;

-- The tick `tick_ns` of `upstream` ended for good (`succeeded`, or failed after its retries), its marker
-- written by this transaction: queue the tick of each dependent whose edge it satisfies (all of a fan-in's
-- upstreams arrived), unless the dependent is disabled, its owner may no longer act for the upstream's, or
-- it has radix.max_requested_ticks() queued already. A RUN JOB's tick ('run') runs its job alone, and an
-- on_failure hook's run is not a tick of its job.
CREATE OR REPLACE FUNCTION radix._fire_dependents(upstream uuid, tick_ns bigint, run_kind text,
                                                  succeeded boolean) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    d record;
    fired uuid[];
BEGIN
    IF run_kind IN ('run', 'on_failure') OR NOT EXISTS (SELECT 1 FROM radix.job_edges e WHERE e.upstream_id = upstream) THEN
        RETURN;
    END IF;
    FOR d IN
        SELECT k.job_id, k.owner_name,
               (SELECT count(*) FROM radix.job_edges x WHERE x.job_id = k.job_id) AS upstreams
        FROM radix.job_edges e
        JOIN radix.jobs k ON k.job_id = e.job_id
        JOIN radix.jobs u ON u.job_id = e.upstream_id
        WHERE e.upstream_id = upstream AND k.enabled
          AND (e.condition = 'completes' OR (e.condition = 'succeeds') = succeeded)
          AND radix._acts_for(k.owner_oid, u.owner_oid)
        ORDER BY k.job_id
    LOOP
        IF d.upstreams > 1 THEN
            fired := NULL;
            INSERT INTO radix.edge_fires AS f (job_id, planned_ns, fired) VALUES (d.job_id, tick_ns, ARRAY[upstream])
            ON CONFLICT (job_id, planned_ns) DO UPDATE SET fired = f.fired || upstream
            WHERE NOT upstream = ANY (f.fired)
            RETURNING f.fired INTO fired;
            IF fired IS NULL OR EXISTS (SELECT 1 FROM radix.job_edges x
                                        WHERE x.job_id = d.job_id AND NOT x.upstream_id = ANY (fired)) THEN
                -- waiting for the others; at most max_requested_ticks() planned times wait per dependent
                DELETE FROM radix.edge_fires f WHERE f.job_id = d.job_id AND f.planned_ns <= (
                    SELECT o.planned_ns FROM radix.edge_fires o WHERE o.job_id = d.job_id
                    ORDER BY o.planned_ns DESC OFFSET radix.max_requested_ticks() LIMIT 1);
                CONTINUE;
            END IF;
            DELETE FROM radix.edge_fires f WHERE f.job_id = d.job_id AND f.planned_ns = tick_ns;
        END IF;
        IF EXISTS (SELECT 1 FROM radix.job_requests q WHERE q.job_id = d.job_id
                   OFFSET radix.max_requested_ticks() - 1 LIMIT 1) THEN
            CONTINUE;
        END IF;
        INSERT INTO radix.job_requests (job_id, planned_ns, kind, requested_by)
        VALUES (d.job_id, tick_ns, 'after', d.owner_name) ON CONFLICT DO NOTHING;
        -- installed by the next radix.find_ticks (never waiting here for the dependent's own state row)
        PERFORM radix._hint('radix_jobs', d.job_id::text);
    END LOOP;
END $$;

-- The jobs that run after `job`, directly or down a chain (for DROP JOB … CASCADE, and RESTRICT's refusal).
CREATE OR REPLACE FUNCTION radix._downstream_of(job uuid) RETURNS TABLE (job_id uuid)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
BEGIN ATOMIC
    WITH RECURSIVE down (job_id) AS (
        SELECT e.job_id FROM radix.job_edges e WHERE e.upstream_id = job
        UNION
        SELECT e.job_id FROM radix.job_edges e JOIN down d ON e.upstream_id = d.job_id
    )
    SELECT d.job_id FROM down d;
END;

-- A job's name as `caller` may be told it: its qualified name when the caller may act for its owner, else
-- no name.
CREATE OR REPLACE FUNCTION radix._job_name_for(caller oid, j radix.jobs) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN CASE WHEN radix._acts_for(caller, j.owner_oid)
            THEN 'job ' || quote_ident(j.schema_name) || '.' || quote_ident(j.job_name)
            ELSE 'a job of another owner' END;
