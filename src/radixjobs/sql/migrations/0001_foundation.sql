-- 0001: the radix schema. Objects are created by later migrations; ordinary roles may use what is
-- granted to them explicitly (functions such as radix.current_job_id()), and create nothing here.
COMMENT ON SCHEMA radix IS 'radixjobs: durable, SQL-native job scheduler';
REVOKE ALL ON SCHEMA radix FROM PUBLIC;
GRANT USAGE ON SCHEMA radix TO PUBLIC;
