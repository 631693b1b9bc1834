-- WITH (start_deadline = '10 minutes'): a tick that cannot start within this of its start time is recorded
-- 'missed' and skipped (radix._skip_missed). WITH (jitter = '30 seconds'): each tick becomes due at a
-- deterministic offset in [0, jitter) from its planned time (radix._jitter_ns). NULL: none.
ALTER TABLE radix.jobs
    ADD COLUMN start_deadline_ns bigint CHECK (start_deadline_ns BETWEEN 1 AND 3155760000000000000),  -- 100 years
    ADD COLUMN jitter_ns bigint CHECK (jitter_ns BETWEEN 1 AND 3155760000000000000),
    ADD CHECK (jitter_ns IS NULL OR interval_ns IS NULL OR jitter_ns < interval_ns);

-- The jobs with a start deadline, for the finder's sweep of missed ticks (a probe of an empty index while no
-- job has one).
CREATE INDEX jobs_start_deadline ON radix.jobs (job_id) WHERE start_deadline_ns IS NOT NULL;
