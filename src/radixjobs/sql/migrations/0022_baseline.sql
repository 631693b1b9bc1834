-- The baseline: radix's tables, indexes and the rows they start with, as they stand at schema 22.
--
-- Migrations hold tables, columns, indexes and data only; every function, view, trigger and grant lives once
-- in sql/routines/ and is applied by the install whenever it changed (routines.py). An install at schema 17
-- to 21 already has exactly these tables (those versions changed routines only), so the installer records this baseline for it
-- without running it; older installs are refused.
--
-- Catalog tables are written only by radix's SECURITY DEFINER functions: no ordinary role holds a privilege
-- on any of them (sql/routines/grants.sql). Times the engine computes with are bigint nanoseconds since the
-- epoch (radix.to_ns); columns named *_at are for people.

COMMENT ON SCHEMA radix IS 'radixjobs: durable, SQL-native job scheduler';

-- One row per job: its CALL, bound and checked at admission, its schedule and options.
CREATE TABLE radix.jobs (
    job_id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    schema_name        name NOT NULL,
    job_name           name NOT NULL,
    owner_oid          oid NOT NULL,
    owner_name         name NOT NULL,
    principal_oid      oid NOT NULL,
    principal_name     name NOT NULL,
    procedure_oid      oid NOT NULL,
    procedure_signature text NOT NULL,
    arguments          jsonb NOT NULL DEFAULT '[]',
    schedule_kind      text NOT NULL CHECK (schedule_kind IN ('every', 'at', 'cron')),
    interval_ns        bigint CHECK (interval_ns > 0),
    starting_at_ns     bigint,
    at_ns              bigint,
    cron_expression    text,
    cron_time_zone     text,
    enabled            boolean NOT NULL DEFAULT true,
    definition_version bigint NOT NULL DEFAULT 1,
    deadline_ms        integer NOT NULL DEFAULT 240000 CHECK (deadline_ms BETWEEN 1 AND 604800000),
    non_atomic         boolean NOT NULL DEFAULT false,
    created_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    max_attempts       integer NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 10),
    history_limit      integer NOT NULL DEFAULT 256 CHECK (history_limit BETWEEN 1 AND 100000),
    coalesce_ticks     boolean NOT NULL DEFAULT true,
    UNIQUE (schema_name, job_name),
    CHECK ((schedule_kind = 'every') = (interval_ns IS NOT NULL)),
    CHECK ((schedule_kind = 'at') = (at_ns IS NOT NULL)),
    CHECK ((schedule_kind = 'cron') = (cron_expression IS NOT NULL))
);

-- Cron jobs, for the engine's planning pass (it must not read every job to find the few cron ones).
CREATE INDEX jobs_cron ON radix.jobs (job_id) WHERE schedule_kind = 'cron';

-- The scheduler's state of each job: the next tick, the attempt in flight and its lease, a queued request.
-- principal_oid is kept from radix.jobs (so due work can be found per principal), via_lease too: the ticks of
-- non-atomic procedures and cron schedules always take the lease path (cron ticks are planned, and missed
-- ones coalesced, by the daemon before the claim).
CREATE TABLE radix.radix_system_job_state (
    job_id             uuid PRIMARY KEY REFERENCES radix.jobs ON DELETE CASCADE,
    definition_version bigint NOT NULL,
    status             text NOT NULL CHECK (status IN
                         ('scheduled', 'running', 'retry_wait', 'complete', 'failed', 'disabled')),
    anchor_ns          bigint NOT NULL,
    planned_ns         bigint,
    attempt            integer NOT NULL DEFAULT 0,
    due_ns             bigint,
    idempotency_key    text,
    lease_node         text,
    lease_token        uuid,
    lease_expires_at   timestamptz,
    coalesced_ticks    bigint NOT NULL DEFAULT 0,
    last_error         jsonb,
    updated_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    atomic_hint        boolean,
    principal_oid      oid NOT NULL,
    request_kind       text CHECK (request_kind IN ('run', 'backfill')),
    stash              jsonb,
    fence_node         text,
    fence_token        uuid,
    via_lease          boolean NOT NULL DEFAULT false,
    CHECK ((request_kind IS NULL) = (stash IS NULL))
);

-- The claim query reads only due rows of live statuses: a partial index keeps it off the catalog.
CREATE INDEX radix_system_job_state_due ON radix.radix_system_job_state (due_ns)
    WHERE status IN ('scheduled', 'running', 'retry_wait');

-- Running claims by node: finding the claims of dead nodes reads only running rows, whatever the number
-- of jobs (radix_system_job_state_due holds every scheduled row, so it cannot serve this).
CREATE INDEX radix_system_job_state_running ON radix.radix_system_job_state (lease_node)
    WHERE status = 'running';

-- Due work per principal, in due order: the claim reads each principal's earliest ticks from here, and
-- the distinct principals with live rows by a skip scan (two descents per principal).
CREATE INDEX radix_system_job_state_principal_due ON radix.radix_system_job_state (principal_oid, due_ns)
    WHERE status IN ('scheduled', 'running', 'retry_wait');

CREATE INDEX radix_system_job_state_token ON radix.radix_system_job_state (lease_token)
    WHERE status = 'running';

-- Due work of the lease path, found without reading the atomic backlog.
CREATE INDEX radix_system_job_state_lease_due ON radix.radix_system_job_state (due_ns)
    WHERE status IN ('scheduled', 'running', 'retry_wait')
      AND (via_lease OR request_kind IS NOT NULL OR status = 'running');

-- One row per attempt. No foreign key to radix.jobs: every claim inserts a row, and a key's check would lock
-- the job's row (KEY SHARE: a heap write and WAL per insert) for nothing, since only radix's definer functions
-- write here, for a job whose state row they hold; the trigger job_dropped deletes a dropped job's rows.
CREATE TABLE radix.radix_system_job_history (
    history_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id             uuid NOT NULL,
    definition_version bigint NOT NULL,
    planned_ns         bigint NOT NULL,
    attempt            integer NOT NULL,
    idempotency_key    text NOT NULL,
    status             text NOT NULL,
    node               text,
    atomic             boolean,
    started_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at        timestamptz,
    error              jsonb,
    run_kind           text NOT NULL DEFAULT 'schedule' CHECK (run_kind IN ('schedule', 'run', 'backfill'))
);

CREATE INDEX radix_system_job_history_job ON radix.radix_system_job_history (job_id, history_id);

CREATE UNIQUE INDEX radix_system_job_history_running
    ON radix.radix_system_job_history (job_id, planned_ns, attempt) WHERE status = 'running';

-- Scheduler nodes of this database.
CREATE TABLE radix.nodes (
    node_id       text PRIMARY KEY,
    backend_pid   integer,       -- the node's control session: the node is alive while it is
    backend_start timestamptz,
    hostname      text,
    pid         integer,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per attempt in progress, keyed by the principal backend running it. Atomic attempts write
-- it inside their own transaction (visible only to that backend); non-atomic ones commit it first.
-- No foreign key to radix.jobs, as for the history.
CREATE TABLE radix.attempt_frames (
    pid             integer PRIMARY KEY,
    backend_start   timestamptz NOT NULL,
    job_id          uuid NOT NULL,
    attempt         integer NOT NULL,
    planned_ns      bigint NOT NULL,
    idempotency_key text NOT NULL,
    lease_token     uuid NOT NULL
);

CREATE INDEX attempt_frames_job ON radix.attempt_frames (job_id);

-- Keys that non-atomic procedures have already acted on (radix.once()).
CREATE TABLE radix.idempotency_keys (
    idempotency_key text PRIMARY KEY,
    job_id          uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Ticks queued by RUN JOB and BACKFILL JOB, promoted one at a time into the job's state.
CREATE TABLE radix.job_requests (
    job_id       uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    planned_ns   bigint NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('run', 'backfill')),
    requested_by name NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, planned_ns)
);

-- The ticks a backfill has already run, so a repeated BACKFILL skips them.
CREATE TABLE radix.backfill_done (
    job_id     uuid NOT NULL REFERENCES radix.jobs ON DELETE CASCADE,
    planned_ns bigint NOT NULL,
    PRIMARY KEY (job_id, planned_ns)
);

-- One row per job (the trigger job_tick_lock adds it): the tick's fence. begin_tick locks the row FOR UPDATE
-- SKIP LOCKED and holds it until the tick's transaction ends; the finder and other nodes skip a locked row.
CREATE TABLE radix.tick_locks (
    job_id uuid PRIMARY KEY REFERENCES radix.jobs ON DELETE CASCADE
);

-- The row every claim locks first (FOR UPDATE): no ordinary role has a privilege on the table, so none
-- can lock it or hold a claim up.
CREATE TABLE radix.claim_serial (only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row));
INSERT INTO radix.claim_serial VALUES (true);

-- One row per job name ('job', quoted schema.name) or document NUM ('doc', NUM) ever admitted; its row lock
-- serialises admission of that name. Rows are kept (deleting one under a waiter would let two
-- admissions of the name through).
CREATE TABLE radix.name_locks (
    kind text NOT NULL CHECK (kind IN ('job', 'doc')),
    name text NOT NULL,
    PRIMARY KEY (kind, name)
);

-- One row: 32 bytes from two gen_random_uuid() (pg_strong_random; 244 random bits). Nobody but radix
-- reads it; a new secret (UPDATE as radix) only makes attempts in flight fail their begin and retry.
CREATE TABLE radix.attempt_secret (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret   bytea NOT NULL
);
INSERT INTO radix.attempt_secret (secret)
VALUES (uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));

-- CRON_TABLE documents (docs/documents.md) and the processes the document scheduler runs for them.
CREATE TABLE radix.cron_table (
    num              text PRIMARY KEY,
    dockind          text NOT NULL DEFAULT 'CRON_TABLE' CHECK (dockind = 'CRON_TABLE'),
    status           text NOT NULL CHECK (status IN
                       ('CRON_TABLE_ACTIVE', 'CRON_TABLE_PASSIVE', 'CRON_TABLE_ERROR')),
    props            jsonb NOT NULL,
    owner_oid        oid NOT NULL,          -- the role that created the document
    writer_oid       oid NOT NULL,          -- the role whose apply last changed it: RUN_AS was checked for it
    principal_oid    oid NOT NULL,          -- RUN_AS
    version          bigint NOT NULL DEFAULT 1,
    first_run        timestamptz,
    -- maintained by the scheduler
    sys_process_id   bigint,
    count_error      integer NOT NULL DEFAULT 0,
    last_run         timestamptz,
    next_run         timestamptz,
    daily_start_time timestamptz,
    daily_end_time   timestamptz,
    error_text       text,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE radix.sys_processes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_num    text NOT NULL REFERENCES radix.cron_table ON DELETE CASCADE,
    doc_version bigint NOT NULL,
    type        text NOT NULL CHECK (type IN ('db', 'csp')),
    target      text NOT NULL,
    params      jsonb,
    status      text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'completed', 'failed')),
    error_text  text,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    node        text NOT NULL
);

CREATE INDEX sys_processes_task ON radix.sys_processes (task_num, id);

-- Which roles a document may name a CSP service for (radix.grant_service).
CREATE TABLE radix.service_grants (
    service    text NOT NULL CHECK (btrim(service) <> '' AND length(service) <= 200),
    grantee    oid NOT NULL,                 -- 0: PUBLIC
    granted_by oid NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (service, grantee)
);

-- radix_admin: the role whose members are operators (radix._is_operator). Cluster-wide, so made once.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'radix_admin') THEN
        RETURN;
    ELSIF NOT (SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user) THEN
        RAISE NOTICE 'role radix_admin was not created: role % may not create roles. The operator creates it '
                     'once per cluster: CREATE ROLE radix_admin NOLOGIN; then GRANT radix_admin TO <role>',
                     quote_ident(current_user);
        RETURN;
    END IF;
    BEGIN
        CREATE ROLE radix_admin NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- an install in another database of the cluster created it first
    END;
END $$;
