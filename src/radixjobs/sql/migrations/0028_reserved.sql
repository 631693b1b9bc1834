-- Reserved on this branch for the job dependencies' migration (0028_job_dependencies.sql), which replaces
-- this file when the branches merge; 0029 already admits its request kind 'after'.
SELECT;
