-- The document runs in progress by principal, for the fair share that counts them with the jobs' attempts
-- (radix._principal_load, radix._running_elsewhere): a probe of an empty index while none runs.
CREATE INDEX cron_table_running ON radix.cron_table (principal_oid) WHERE sys_process_id IS NOT NULL;
