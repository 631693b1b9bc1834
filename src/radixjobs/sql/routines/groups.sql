-- Job groups: a cap on the attempts of a set of jobs running at once, across every node.
--
-- A group is a name, database-wide (not schema-qualified), with an owner (its creator) and max_running.
-- A job joins with WITH (group = 'name') or ALTER JOB … SET (group = 'name') when its owner may act as the
-- group's owner (radix._acts_for); a group is seen only by roles that may (radix._owner_visible).
--
-- How the cap holds: a job in a group runs on the lease path only (its state row's via_lease, kept by
-- radix._job_path_changed), so each attempt of it is a claim of radix.claim_due, and a claim's state row
-- shows 'running' from the claim to the attempt's end, whichever node runs it. Every claim_due holds
-- radix.claim_serial (EXCLUSIVE) until it commits, so claims never race: a claim counts the group's running
-- state rows (radix._group_room), takes at most the free places, due ticks oldest first, and a due tick of
-- a full group waits in its state row, holding no slot, until a place frees (radix._full_groups keeps it
-- out of radix.next_due_in and radix.lease_work_due meanwhile).

-- May `caller` act for `owner` (it is a superuser, or has the owner's privileges)? The rule of a job's
-- owner (radix._check_job_owner) and of a group's.
CREATE OR REPLACE FUNCTION radix._acts_for(caller oid, owner oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = caller), false)
    OR (EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = owner)
        AND pg_catalog.pg_has_role(caller, owner, 'USAGE'));

-- A group's max_running as given ({"max_running": 2}); raises naming the option for anything else.
CREATE OR REPLACE FUNCTION radix._group_max_running(opts jsonb) RETURNS integer
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    k text;
    v text;
BEGIN
    FOR k IN SELECT jsonb_object_keys(coalesce(opts, '{}'::jsonb)) LOOP
        IF k <> 'max_running' THEN
            RAISE EXCEPTION 'unknown job group option "%" (accepted: max_running)', k USING ERRCODE = '22023';
        END IF;
    END LOOP;
    v := opts->>'max_running';
    IF v IS NULL OR v !~ '^[0-9]{1,5}$' OR v::integer NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'option max_running must be an integer from 1 to 10000' USING ERRCODE = '22023';
    END IF;
    RETURN v::integer;
END $$;

-- The group called `name` as `caller` sees it, locked FOR UPDATE when `lock` (a bounded wait: a job
-- joining it in an open transaction holds it KEY SHARE); raises 42704 when it does not exist or the caller
-- may not see it.
CREATE OR REPLACE FUNCTION radix._find_group(caller oid, name text, lock boolean) RETURNS radix.job_groups
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    g radix.job_groups;
    prior_timeout text;
BEGIN
    IF lock THEN
        prior_timeout := radix._bound_lock_wait();
        BEGIN
            SELECT * INTO g FROM radix.job_groups x WHERE x.group_name = name FOR UPDATE;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'job group % is being changed by another transaction; try again', quote_ident(name)
                USING ERRCODE = '55P03';
        END;
        PERFORM pg_catalog.set_config('lock_timeout', prior_timeout, true);
    ELSE
        SELECT * INTO g FROM radix.job_groups x WHERE x.group_name = name;
    END IF;
    IF g.group_id IS NULL OR NOT radix._acts_for(caller, g.owner_oid) THEN
        RAISE EXCEPTION 'job group % does not exist', quote_ident(name) USING ERRCODE = '42704';
    END IF;
    RETURN g;
END $$;

-- The group a job owned by `owner` joins, by name (NULL: none); 42501 when the owner may not act for the
-- group's owner.
CREATE OR REPLACE FUNCTION radix._group_for_job(owner oid, name text) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    g radix.job_groups;
BEGIN
    IF name IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO g FROM radix.job_groups x WHERE x.group_name = name;  -- (the foreign key holds it)
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job group % does not exist', quote_ident(name) USING ERRCODE = '42704';
    END IF;
    IF NOT radix._acts_for(owner, g.owner_oid) THEN
        RAISE EXCEPTION 'permission denied for job group %: the job''s owner may not act as its owner %',
            quote_ident(name), quote_ident(g.owner_name) USING ERRCODE = '42501';
    END IF;
    RETURN g.group_id;
END $$;

-- CREATE JOB GROUP name WITH (max_running = N), as `creator` (checked by radix._caller).
CREATE OR REPLACE FUNCTION radix._create_job_group(creator name, name text, opts jsonb, if_not_exists boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    caller oid := radix._caller(creator);
    cap integer := radix._group_max_running(opts);
BEGIN
    IF coalesce(name, '') = '' OR octet_length(name) > 63 THEN
        RAISE EXCEPTION 'invalid job group name %', quote_literal(coalesce(name, '')) USING ERRCODE = '42602';
    END IF;
    INSERT INTO radix.job_groups (group_name, owner_oid, owner_name, max_running)
    VALUES (name, caller, (SELECT r.rolname FROM pg_catalog.pg_roles r WHERE r.oid = caller), cap)
    ON CONFLICT (group_name) DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    IF if_not_exists THEN
        RETURN false;
    END IF;
    RAISE EXCEPTION 'job group % already exists', quote_ident(name) USING ERRCODE = '42710';
END $$;

CREATE OR REPLACE FUNCTION radix.create_job_group(name text, options jsonb, if_not_exists boolean DEFAULT false)
RETURNS boolean LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN radix._create_job_group(current_user, name, options, if_not_exists);

-- ALTER JOB GROUP name SET (max_running = N) / RESET (max_running): only its owner (or a role acting for
-- it). RESET gives max_running = 1. A lower cap holds for the claims made after it: running attempts end
-- as they would.
CREATE OR REPLACE FUNCTION radix._alter_job_group(creator name, name text, opts jsonb, reset text[])
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    caller oid := radix._caller(creator);
    g radix.job_groups := radix._find_group(caller, name, true);
    cap integer;
BEGIN
    IF reset IS NOT NULL AND (cardinality(reset) <> 1 OR reset[1] <> 'max_running') THEN
        RAISE EXCEPTION 'unknown job group option "%" (accepted: max_running)',
            (SELECT r FROM unnest(reset) r WHERE r <> 'max_running' LIMIT 1) USING ERRCODE = '22023';
    END IF;
    cap := CASE WHEN reset IS NOT NULL THEN 1 ELSE radix._group_max_running(opts) END;
    UPDATE radix.job_groups x SET max_running = cap WHERE x.group_id = g.group_id AND x.max_running <> cap;
    PERFORM radix._hint('radix_jobs', g.group_id::text);
    RETURN FOUND;
END $$;

CREATE OR REPLACE FUNCTION radix.alter_job_group(name text, options jsonb DEFAULT NULL, reset text[] DEFAULT NULL)
RETURNS boolean LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN radix._alter_job_group(current_user, name, options, reset);

-- DROP JOB GROUP [IF EXISTS] name: refused while jobs are in it (the error names them, up to five).
CREATE OR REPLACE FUNCTION radix._drop_job_group(creator name, name text, if_exists boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    caller oid := radix._caller(creator);
    g radix.job_groups;
    members text;
    n bigint;
BEGIN
    IF if_exists AND NOT EXISTS (SELECT 1 FROM radix.job_groups x WHERE x.group_name = name
                                 AND radix._acts_for(caller, x.owner_oid)) THEN
        RETURN false;
    END IF;
    g := radix._find_group(caller, name, true);
    n := (SELECT count(*) FROM radix.jobs j WHERE j.group_id = g.group_id);
    IF n > 0 THEN
        members := (SELECT string_agg(m.q, ', ' ORDER BY m.q) FROM (
                        SELECT quote_ident(j.schema_name) || '.' || quote_ident(j.job_name) AS q
                        FROM radix.jobs j WHERE j.group_id = g.group_id
                        ORDER BY j.schema_name, j.job_name LIMIT 5) m);
        RAISE EXCEPTION 'cannot drop job group % because % job(s) are in it: %', quote_ident(name), n,
            members || CASE WHEN n > 5 THEN ', …' ELSE '' END USING ERRCODE = '2BP01';
    END IF;
    DELETE FROM radix.job_groups x WHERE x.group_id = g.group_id;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION radix.drop_job_group(name text, if_exists boolean DEFAULT false)
RETURNS boolean LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN radix._drop_job_group(current_user, name, if_exists);

-- The groups with no free place now: as many of their jobs' state rows 'running' as max_running. Empty
-- (one probe of the table) while no group exists.
CREATE OR REPLACE FUNCTION radix._full_groups() RETURNS bigint[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM radix.job_groups) THEN
        RETURN '{}';
    END IF;
    RETURN ARRAY(SELECT r.group_id FROM radix._group_room(NULL) r WHERE r.room <= 0);
END $$;

-- Each group's free places: max_running less its jobs' state rows 'running', not counting the jobs in
-- `passing` (rows a claim is about to take over, e.g. a dead node's).
CREATE OR REPLACE FUNCTION radix._group_room(passing uuid[])
RETURNS TABLE (group_id bigint, room integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
BEGIN ATOMIC
    SELECT g.group_id, g.max_running - (
               SELECT count(*)::integer FROM radix.jobs j JOIN radix.radix_system_job_state s ON s.job_id = j.job_id
               WHERE j.group_id = g.group_id AND s.status = 'running'
                 AND s.job_id <> ALL (coalesce(passing, '{}')))
    FROM radix.job_groups g;
END;

-- Of `picked` (a claim's state rows, in claim order), those a group's cap leaves: per group, the first
-- ones up to its free places, oldest due first (fair: the order the group's ticks came due). Jobs in no
-- group all stay. The caller holds radix.claim_serial.
CREATE OR REPLACE FUNCTION radix._within_group_caps(picked uuid[]) RETURNS uuid[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
BEGIN ATOMIC
    SELECT coalesce(array_agg(x.id ORDER BY x.i), '{}')
    FROM (SELECT p.id, p.i, j.group_id,
                 row_number() OVER (PARTITION BY j.group_id ORDER BY s.due_ns, p.i) AS nth
          FROM unnest(picked) WITH ORDINALITY AS p(id, i)
          JOIN radix.jobs j ON j.job_id = p.id
          JOIN radix.radix_system_job_state s ON s.job_id = p.id) x
    LEFT JOIN radix._group_room(picked) r ON r.group_id = x.group_id
    WHERE x.group_id IS NULL OR x.nth <= r.room;
END;

-- The groups the current role sees, with their jobs and running attempts now.
CREATE OR REPLACE VIEW radix.job_group_overview WITH (security_barrier) AS
SELECT g.group_name AS name, g.owner_name AS owner, g.max_running,
       (SELECT count(*) FROM radix.jobs j WHERE j.group_id = g.group_id) AS jobs,
       (SELECT count(*) FROM radix.jobs j JOIN radix.radix_system_job_state s ON s.job_id = j.job_id
        WHERE j.group_id = g.group_id AND s.status = 'running') AS running,
       g.created_at
FROM radix.job_groups g
WHERE radix._owner_visible(g.owner_oid);
