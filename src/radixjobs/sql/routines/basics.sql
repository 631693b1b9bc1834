-- Time in nanoseconds, the limits every role may read, lock waits, hints and the schema version.

-- Time helpers: schedule arithmetic is in UTC nanoseconds (bigint).
-- to_ns is inlined into its callers (the hot path's WHERE clauses): its body calls only immutable functions
-- (an interval's epoch; a timestamptz's extract is stable, and an immutable SQL function whose body is not
-- immutable is called, not inlined). The same value as extract(epoch FROM t), whatever the session's TimeZone.
CREATE OR REPLACE FUNCTION radix.to_ns(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (extract(epoch FROM t - 'epoch'::timestamptz) * 1000000000)::bigint;

CREATE OR REPLACE FUNCTION radix.from_ns(ns bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN to_timestamp(0) + make_interval(secs => ns / 1000000000.0);

-- The limits, as constants: an administrator may CREATE OR REPLACE these (superuser), and admission reads
-- them at every call. 64 KiB is far above what parameters of a scheduled call need (ids, batch sizes,
-- dates, small JSON settings: bulk data belongs in tables), and keeps a definition small enough that the
-- engine caches thousands of them in a few megabytes.
CREATE OR REPLACE FUNCTION radix.max_argument_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 65536;
COMMENT ON FUNCTION radix.max_argument_bytes() IS
    'radixjobs: the most bytes of canonical argument text one job may store (all arguments together)';

CREATE OR REPLACE FUNCTION radix.max_document_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 65536;
COMMENT ON FUNCTION radix.max_document_bytes() IS
    'radixjobs: the most bytes a CRON_TABLE document''s props may take as JSON text';

-- A value's text in one fixed format, whatever the session prints with: ISO dates, postgres-style
-- intervals, shortest exact floats, time stamps in UTC, hex bytea. The argument was read with the
-- caller's settings, as CALL reads it; only the printing is fixed, so the engine's session, with its
-- own settings, reads back the same value. The text comes from the type's output function (format's %s),
-- never from a cast to text: the owner of a type may CREATE CAST (type AS text) with any function, and
-- the engine reads the value back with the type's input function. NULL stays NULL (num_nulls: a row
-- whose fields are all NULL is a value, not NULL).
CREATE OR REPLACE FUNCTION radix._canonical_text(v anyelement) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET DateStyle = 'ISO, YMD'
SET IntervalStyle = 'postgres'
SET extra_float_digits = 1
SET TimeZone = 'UTC'
SET bytea_output = 'hex'
SET jit = off
AS $$
BEGIN
    IF pg_catalog.num_nulls(v) = 1 THEN
        RETURN NULL;
    END IF;
    RETURN pg_catalog.format('%s', v);
END $$;

-- Bound this transaction's lock waits: 5 s, or the caller's own lock_timeout when it is shorter.
-- Returns the setting to restore (set_config(..., true) with it) once the waits are over; an error
-- rolls the setting back with the transaction or savepoint.
CREATE OR REPLACE FUNCTION radix._bound_lock_wait() RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    prior text := pg_catalog.current_setting('lock_timeout');
    prior_ms bigint := (SELECT s.setting::pg_catalog.int8 FROM pg_catalog.pg_settings s
                        WHERE s.name OPERATOR(pg_catalog.=) 'lock_timeout');
BEGIN
    IF prior_ms OPERATOR(pg_catalog.=) 0 OR prior_ms OPERATOR(pg_catalog.>) 5000 THEN
        PERFORM pg_catalog.set_config('lock_timeout', '5s', true);
    END IF;
    RETURN prior;
END $$;

-- Lock a name for admission until the end of the transaction (re-entrant within it); a wait past the
-- bound raises 55P03 with a one-line message.
CREATE OR REPLACE FUNCTION radix._lock_name(kind text, name text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    INSERT INTO radix.name_locks (kind, name) VALUES (_lock_name.kind, _lock_name.name)
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM radix.name_locks l
    WHERE l.kind OPERATOR(pg_catalog.=) _lock_name.kind AND l.name OPERATOR(pg_catalog.=) _lock_name.name
    FOR UPDATE;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION '% % is being created or changed by another transaction; try again',
        CASE kind WHEN 'job' THEN 'job' ELSE 'CRON_TABLE task' END, name
        USING ERRCODE = '55P03',
              HINT = 'Another session holds it in an open transaction (see pg_stat_activity).';
END $$;

-- A wake-up for the schedulers, skipped while the notification queue is half full or more: PostgreSQL
-- warns at that level too, and the other half is the margin against the queue filling between this
-- check and COMMIT. A skipped hint costs at most one poll period (serve --poll, the document check).
CREATE OR REPLACE FUNCTION radix._hint(channel text, payload text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    IF pg_catalog.pg_notification_queue_usage() OPERATOR(pg_catalog.<) 0.5 THEN
        PERFORM pg_catalog.pg_notify(channel, payload);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION radix.schema_version() RETURNS integer
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN (SELECT max(version) FROM radix.schema_migrations);
COMMENT ON FUNCTION radix.schema_version() IS
    'The installed radix schema version (the newest applied migration), readable by every role.';

CREATE OR REPLACE FUNCTION radix.routine_checksum() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN (SELECT checksum FROM radix.routine_source);
COMMENT ON FUNCTION radix.routine_checksum() IS
    'The checksum of the radix routines installed (sql/routines/ as applied), readable by every role.';

CREATE OR REPLACE FUNCTION radix.max_timeout_ms() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 604800000;
COMMENT ON FUNCTION radix.max_timeout_ms() IS 'radixjobs: the longest timeout (deadline) a job may have, in ms';

CREATE OR REPLACE FUNCTION radix.max_requested_ticks() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 10000;
COMMENT ON FUNCTION radix.max_requested_ticks() IS
    'radixjobs: the most ticks one RUN JOB ... FOR RANGE may queue, and the most requests a job may have queued';

CREATE OR REPLACE FUNCTION radix.max_missed_ticks() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1000;
COMMENT ON FUNCTION radix.max_missed_ticks() IS
    'radixjobs: with coalesce = off, at most this many missed ticks of a job are run (the newest ones)';
