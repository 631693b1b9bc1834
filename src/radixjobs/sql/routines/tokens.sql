-- Tokens and MACs: the secrets that fence an attempt to the session and the tick it was started for.

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

CREATE OR REPLACE FUNCTION radix.attempt_session() RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN encode(radix._session_key(), 'hex');
END $$;
