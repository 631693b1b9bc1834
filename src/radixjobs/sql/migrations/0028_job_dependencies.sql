-- Dependencies: CREATE JOB … SCHEDULE AFTER upstream [SUCCEEDS | FAILS | COMPLETES] [AND …]. A dependent
-- job has no clock of its own: each upstream tick that ends as its edge names queues one tick of the
-- dependent with the same planned time (request kind 'after'), in the transaction of the upstream's marker.
ALTER TABLE radix.jobs DROP CONSTRAINT jobs_schedule_kind_check,
    ADD CONSTRAINT jobs_schedule_kind_check CHECK (schedule_kind IN ('every', 'at', 'cron', 'after'));

-- The edges: `job_id` runs after `upstream_id` ends as `condition`. A dependent's edges go with it; an
-- upstream is dropped only with its dependents (DROP JOB … CASCADE).
CREATE TABLE radix.job_edges (
    job_id      uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    upstream_id uuid NOT NULL REFERENCES radix.jobs,
    condition   text NOT NULL CHECK (condition IN ('succeeds', 'fails', 'completes')),
    PRIMARY KEY (job_id, upstream_id),
    CHECK (job_id <> upstream_id)
);
CREATE INDEX job_edges_upstream ON radix.job_edges (upstream_id);

-- Fan-in: the upstreams of a dependent with more than one that have ended as named for one planned time.
-- The row goes when the last one arrives (the dependent's tick is queued then).
CREATE TABLE radix.edge_fires (
    job_id     uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    planned_ns bigint NOT NULL,
    fired      uuid[] NOT NULL,
    PRIMARY KEY (job_id, planned_ns)
);

ALTER TABLE radix.job_requests DROP CONSTRAINT job_requests_kind_check,
    ADD CONSTRAINT job_requests_kind_check CHECK (kind IN ('run', 'backfill', 'after'));
ALTER TABLE radix.radix_system_job_state DROP CONSTRAINT radix_system_job_state_request_kind_check,
    ADD CONSTRAINT radix_system_job_state_request_kind_check CHECK (request_kind IN ('run', 'backfill', 'after'));
ALTER TABLE radix.radix_system_job_history DROP CONSTRAINT radix_system_job_history_run_kind_check,
    ADD CONSTRAINT radix_system_job_history_run_kind_check
        CHECK (run_kind IN ('schedule', 'run', 'backfill', 'after'));
