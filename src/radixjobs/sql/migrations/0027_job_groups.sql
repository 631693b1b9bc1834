-- Job groups: CREATE JOB GROUP name WITH (max_running = N). At most max_running attempts of the group's
-- jobs run at once, across every node (radix.claim_due counts them). A group's name is one identifier, not
-- schema-qualified: groups are database-wide, each owned by its creator.
CREATE TABLE radix.job_groups (
    group_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_name  text NOT NULL UNIQUE CHECK (group_name <> '' AND octet_length(group_name) <= 63),
    owner_oid   oid NOT NULL,
    owner_name  name NOT NULL,
    max_running integer NOT NULL CHECK (max_running BETWEEN 1 AND 10000),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- A job's group (NULL: none). A group with jobs in it cannot be dropped.
ALTER TABLE radix.jobs ADD COLUMN group_id bigint REFERENCES radix.job_groups (group_id);
CREATE INDEX jobs_group ON radix.jobs (group_id) WHERE group_id IS NOT NULL;
