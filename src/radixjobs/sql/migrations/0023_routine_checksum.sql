-- The checksum of the routines last applied from sql/routines/, which readiness compares with the code's own
-- (a daemon never serves routines of another radixjobs), and the fingerprint of their catalog rows then (an
-- install applies the routines again when either differs: routines.py).
CREATE TABLE radix.routine_source (
    only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    checksum    text NOT NULL,
    fingerprint text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
