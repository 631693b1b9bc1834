-- Run by the migrator before anything else, in its own transaction (concurrent first installs may
-- race here: the loser retries): the ledger of applied migrations, and the row every install locks.
CREATE SCHEMA IF NOT EXISTS radix;
CREATE TABLE IF NOT EXISTS radix.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
REVOKE ALL ON radix.schema_migrations FROM PUBLIC;
-- Installs serialise on this row's lock. A ROW lock: taking one means executing a statement, which
-- needs a privilege PUBLIC does not have (any role can hold TABLE locks on radix tables through PREPARE).
CREATE TABLE IF NOT EXISTS radix.migration_lock (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton)
);
REVOKE ALL ON radix.migration_lock FROM PUBLIC;
INSERT INTO radix.migration_lock VALUES (true) ON CONFLICT DO NOTHING;
