-- Tokens and MACs: the secrets that fence an attempt to the session and the tick it was started for.

-- Each rule below is written once. The first three and _tick_frame_mac_of are plain SQL expressions without a
-- SET clause, so the planner inlines them into the statement that calls them: the hot path's statements
-- (start_tick, end_tick, start_ticks, end_ticks, the finder) call them at no cost, with the secret read once by a join. Their
-- names are resolved when they are created (SQL-standard bodies), whatever the caller's search_path.

-- The tick token L: the first 16 bytes of sha256(secret || job_id || planned_ns || attempt || updated_at), as
-- a uuid. It dies when the job's tick changes (its attempt, or any claim, advance, retry, re-arm or request
-- sets updated_at), and is as unguessable as a random lease token.
CREATE OR REPLACE FUNCTION radix._token_of(secret bytea, job uuid, planned_ns bigint, attempt integer,
                                           updated_at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN encode(substring(sha256(secret || uuid_send(job) || int8send(planned_ns) || int4send(attempt)
                               || timestamptz_send(updated_at)) FROM 1 FOR 16), 'hex')::uuid;

-- A backend's session key: sha256(secret || pid || backend_start). Good only on that backend.
CREATE OR REPLACE FUNCTION radix._session_key_of(secret bytea, pid integer, backend_start timestamptz)
RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN sha256(secret || int4send(pid) || timestamptz_send(backend_start));

-- The MAC of a token for a session: hex(sha256(session key || token)). Query texts carry only this, so a
-- principal reading them (current_query(), pg_stat_activity) learns nothing usable on another backend.
CREATE OR REPLACE FUNCTION radix._mac_of(session_key bytea, token uuid) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN encode(sha256(session_key || uuid_send(token)), 'hex');

CREATE OR REPLACE FUNCTION radix._tick_token(job uuid, planned_ns bigint, attempt integer,
                                             updated_at timestamptz) RETURNS uuid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (SELECT radix._token_of(k.secret, job, planned_ns, attempt, updated_at) FROM radix.attempt_secret k);
END $$;

CREATE OR REPLACE FUNCTION radix._session_key() RETURNS bytea
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (SELECT radix._session_key_of(k.secret, pg_backend_pid(), a.backend_start)
            FROM radix.attempt_secret k, pg_stat_get_activity(pg_backend_pid()) a);
END $$;

CREATE OR REPLACE FUNCTION radix._attempt_mac(token uuid) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN radix._mac_of(radix._session_key(), token);
END $$;

-- The MAC of a tick's frame (the value of `radix.tick`: radix.start_tick, radix.start_ticks), bound to its
-- transaction by the frame's text: hex(sha256(secret || sha256(secret || 'radix.tick/' || frame))).
-- STABLE as its body is (convert_to): an IMMUTABLE declaration would make it a call, not inlined.
CREATE OR REPLACE FUNCTION radix._tick_frame_mac_of(secret bytea, frame text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN encode(sha256(secret || sha256(secret || convert_to('radix.tick/' || frame, 'UTF8'))), 'hex');

CREATE OR REPLACE FUNCTION radix._tick_frame_mac(frame text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN (SELECT radix._tick_frame_mac_of(k.secret, _tick_frame_mac.frame) FROM radix.attempt_secret k);
END $$;

CREATE OR REPLACE FUNCTION radix.attempt_session() RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN encode(radix._session_key(), 'hex');
END $$;
