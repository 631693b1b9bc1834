-- Run by the migrator before anything else, in its own transaction: the ledger of applied migrations and
-- the row every install locks. Only what is missing is created (and its grants set), so concurrent
-- installs never update the same catalog row; when two create the same object, the second waits for the
-- first and fails with a duplicate-object error, and the migrator retries (then finds it all there).
DO $bootstrap$
BEGIN
    IF pg_catalog.to_regnamespace('radix') IS NULL THEN
        CREATE SCHEMA radix;
    END IF;
    IF pg_catalog.to_regclass('radix.schema_migrations') IS NULL THEN
        CREATE TABLE radix.schema_migrations (
            version    integer PRIMARY KEY,
            name       text NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
        );
        REVOKE ALL ON radix.schema_migrations FROM PUBLIC;
    END IF;
    -- Installs serialise on this row's lock. A ROW lock: taking one means running a statement, which needs
    -- a privilege PUBLIC lacks (any role can hold TABLE locks on radix tables through PREPARE).
    IF pg_catalog.to_regclass('radix.migration_lock') IS NULL THEN
        CREATE TABLE radix.migration_lock (
            singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton)
        );
        REVOKE ALL ON radix.migration_lock FROM PUBLIC;
        INSERT INTO radix.migration_lock VALUES (true);
    END IF;
END
$bootstrap$;
