-- The demo of `radixjobs serve --demo`: a principal, a table, a procedure and a job every 5 seconds.
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'radix_demo') THEN
        CREATE ROLE radix_demo LOGIN;
    END IF;
END $$;
CREATE SCHEMA IF NOT EXISTS demo;
CREATE TABLE IF NOT EXISTS demo.runs (
    id           bigserial PRIMARY KEY,
    note         text,
    run_as       text,
    job_id       uuid,
    scheduled_at timestamptz,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
GRANT USAGE ON SCHEMA demo TO radix_demo;
GRANT INSERT, SELECT ON demo.runs TO radix_demo;
GRANT USAGE ON SEQUENCE demo.runs_id_seq TO radix_demo;
CREATE OR REPLACE PROCEDURE demo.record_run(note text DEFAULT 'hello') LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO demo.runs (note, run_as, job_id, scheduled_at)
    VALUES (note, session_user, radix.current_job_id(), radix.current_job_scheduled_at());
END $$;
CREATE JOB IF NOT EXISTS demo.heartbeat
    SCHEDULE EVERY INTERVAL '5 seconds'
    RUN AS radix_demo
    CALL demo.record_run(note => 'tick');
