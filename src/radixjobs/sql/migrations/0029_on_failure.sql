-- WITH (on_failure = 'schema.proc'): a procedure taking one jsonb, CALLed as the job's principal once per
-- terminal failure of a tick (after its retries). The hook owed is a request of the job, kind 'on_failure'
-- (radix.job_requests), queued in the transaction that records the failure (radix._failed_for_good); its
-- detail is the failure document the hook receives, carried into the state row while the hook runs.
ALTER TABLE radix.jobs
    ADD COLUMN on_failure_oid oid,
    ADD COLUMN on_failure_signature text,
    ADD CHECK ((on_failure_oid IS NULL) = (on_failure_signature IS NULL));

ALTER TABLE radix.job_requests ADD COLUMN detail jsonb;
ALTER TABLE radix.radix_system_job_state ADD COLUMN request_detail jsonb;

ALTER TABLE radix.job_requests DROP CONSTRAINT job_requests_kind_check,
    ADD CONSTRAINT job_requests_kind_check CHECK (kind IN ('run', 'backfill', 'after', 'on_failure'));
ALTER TABLE radix.radix_system_job_state DROP CONSTRAINT radix_system_job_state_request_kind_check,
    ADD CONSTRAINT radix_system_job_state_request_kind_check
        CHECK (request_kind IN ('run', 'backfill', 'after', 'on_failure'));
ALTER TABLE radix.radix_system_job_history DROP CONSTRAINT radix_system_job_history_run_kind_check,
    ADD CONSTRAINT radix_system_job_history_run_kind_check
        CHECK (run_kind IN ('schedule', 'run', 'backfill', 'after', 'on_failure'));
