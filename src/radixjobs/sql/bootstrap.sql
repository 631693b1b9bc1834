-- Run by the migrator before anything else, under its advisory lock: the ledger of applied migrations.
CREATE SCHEMA IF NOT EXISTS radix;
CREATE TABLE IF NOT EXISTS radix.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
REVOKE ALL ON radix.schema_migrations FROM PUBLIC;
