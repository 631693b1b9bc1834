-- The checksum of the routines last applied from sql/routines/ (migrate.py writes it on every install), which
-- readiness compares with the code's own: a daemon never serves routines of another radixjobs.
CREATE TABLE radix.routine_source (
    only_row   boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
