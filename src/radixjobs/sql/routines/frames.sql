-- The attempt's frame: what a running procedure may ask about itself.

-- once(): true the first time the current tick's idempotency key is seen, false after. For procedures
-- that commit inside (run at-least-once): `IF radix.once() THEN <effect>; END IF; COMMIT;` makes the
-- effect and the key commit together, so a resumed tick skips it.
CREATE OR REPLACE FUNCTION radix.once() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
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

-- The frame of the running tick or attempt: a batched tick's from `radix.tick` when its MAC verifies for
-- this transaction, else this backend's frame row (lone ticks, leases), as before.
CREATE OR REPLACE FUNCTION radix._frame() RETURNS radix.attempt_frames
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    value text := current_setting('radix.tick', true);
    xact text := pg_current_xact_id_if_assigned()::text;
    payload text;
    parts text[];
    tick radix.attempt_frames;
BEGIN
    IF xact IS NOT NULL AND length(value) > 65 THEN
        payload := left(value, -65);
        IF right(value, 65) = '/' || radix._tick_frame_mac(xact || '/' || payload) THEN
            parts := string_to_array(payload, '/');  -- made by start_ticks: job, attempt, tick
            tick.pid := pg_backend_pid();
            tick.job_id := parts[1]::uuid;
            tick.attempt := parts[2]::integer;
            tick.planned_ns := parts[3]::bigint;
            tick.idempotency_key := parts[1] || '/' || parts[3];
            RETURN tick;
        END IF;
    END IF;
    RETURN (SELECT f FROM radix.attempt_frames f
            WHERE f.pid = pg_backend_pid() AND EXISTS (
                SELECT 1 FROM pg_stat_get_activity(f.pid) a WHERE a.backend_start = f.backend_start));
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

-- The stored arguments (radix.jobs.arguments) of the job whose attempt or tick runs in this transaction, when
-- its definition is still `version` (the one the engine rendered the CALL from); raises otherwise. An on_failure
-- hook's attempt gets its one argument, the failure document (hooks.sql). Anyone may call it: only a job's own
-- attempt has its frame, so code learns nothing its CALL did not give it.
CREATE OR REPLACE FUNCTION radix.current_arguments(version bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    stored jsonb;
BEGIN
    SELECT CASE WHEN s.request_kind = 'on_failure' THEN jsonb_build_array(jsonb_build_object('value', s.request_detail))
                ELSE j.arguments END
    INTO stored FROM radix.jobs j JOIN radix.radix_system_job_state s ON s.job_id = j.job_id
    WHERE j.job_id = (radix._frame()).job_id AND j.definition_version = version;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no arguments for this call: not inside a radixjobs attempt, or its job changed since it began'
            USING ERRCODE = '55000';
    END IF;
    RETURN stored;
END $$;
