-- The views every role reads: each shows a role only its own rows (operators see all).

CREATE OR REPLACE VIEW radix.document_overview WITH (security_barrier) AS
SELECT c.num, c.dockind, c.status, c.props, pg_get_userbyid(c.owner_oid) AS owner,
       pg_get_userbyid(c.principal_oid) AS principal, c.version, c.first_run, c.sys_process_id,
       c.count_error, c.last_run, c.next_run, c.daily_start_time, c.daily_end_time, c.error_text,
       CASE WHEN c.status = 'CRON_TABLE_ACTIVE' THEN coalesce(c.next_run, c.first_run) END AS next_run_at,
       c.created_at, c.updated_at
FROM radix.cron_table c
WHERE radix._doc_visible(c.owner_oid);

CREATE OR REPLACE VIEW radix.document_processes WITH (security_barrier) AS
SELECT p.id, p.task_num AS num, p.doc_version, p.type, p.target, p.params, p.status, p.error_text,
       p.started_at, p.finished_at, p.finished_at - p.started_at AS duration, p.node
FROM radix.sys_processes p JOIN radix.cron_table c ON c.num = p.task_num
WHERE radix._doc_visible(c.owner_oid);

CREATE OR REPLACE VIEW radix.csp_services WITH (security_barrier) AS
SELECT g.service, CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(g.grantee) END AS grantee,
       pg_get_userbyid(g.granted_by) AS granted_by, g.granted_at
FROM radix.service_grants g
WHERE radix._service_grant_visible(g.grantee);

-- The scheduler nodes, to operators only.
CREATE OR REPLACE VIEW radix.node_overview WITH (security_barrier) AS
SELECT n.node_id, n.hostname, n.pid, n.started_at, n.last_seen, radix.node_is_alive(n.node_id) AS alive
FROM radix.nodes n
WHERE radix._is_operator();
COMMENT ON VIEW radix.node_overview IS
    'Scheduler nodes of this database; rows only for operators (superusers, the radix schema owner, radix_admin).';

-- Each job with its schedule, options, state, the request in progress and the number queued, its grid
-- anchor (what `jobs next` computes from), and the jobs it runs after and that run after it
-- ([{"job", "on", "job_id"}], one the reader does not see named "(hidden)", without its id); a role sees the
-- jobs it owns (operators: all).
CREATE OR REPLACE VIEW radix.job_overview WITH (security_barrier) AS
SELECT j.job_id, quote_ident(j.schema_name) || '.' || quote_ident(j.job_name) AS name,
       j.schema_name, j.job_name, j.owner_name AS owner, j.principal_name AS principal,
       j.procedure_signature AS procedure, j.arguments,
       CASE j.schedule_kind
           WHEN 'every' THEN 'EVERY ' || (j.interval_ns / 1000 * interval '1 microsecond')::text
                || coalesce(' STARTING AT ' || radix.from_ns(j.starting_at_ns)::text, '')
           WHEN 'at' THEN 'AT ' || radix.from_ns(j.at_ns)::text
           WHEN 'after' THEN 'AFTER ' || g.after_text
           ELSE 'CRON ' || quote_literal(j.cron_expression) || ' TIME ZONE ' || quote_literal(j.cron_time_zone)
       END AS schedule,
       j.schedule_kind, j.interval_ns, j.starting_at_ns, j.at_ns, j.cron_expression, j.cron_time_zone,
       j.enabled, j.definition_version, j.deadline_ms, j.non_atomic, j.created_at,
       s.status, s.planned_ns,
       CASE s.status WHEN 'scheduled' THEN radix.from_ns(s.planned_ns)
                     WHEN 'running' THEN radix.from_ns(s.planned_ns)
                     WHEN 'retry_wait' THEN radix.from_ns(s.due_ns) END AS next_run_at,
       s.attempt, s.due_ns,
       s.idempotency_key, s.lease_node, s.lease_expires_at, s.coalesced_ticks, s.last_error,
       j.max_attempts, j.history_limit, j.coalesce_ticks, j.batch_ticks, j.start_deadline_ns, j.jitter_ns,
       s.request_kind,
       (SELECT count(*) FROM radix.job_requests q WHERE q.job_id = j.job_id) AS queued_runs,
       s.anchor_ns,
       (SELECT g.group_name FROM radix.job_groups g WHERE g.group_id = j.group_id) AS group_name,
       j.on_failure_signature AS on_failure, g.upstreams, g.downstreams
FROM radix.jobs j LEFT JOIN radix.radix_system_job_state s USING (job_id)
CROSS JOIN LATERAL (
    SELECT coalesce(jsonb_agg(x.edge ORDER BY x.name) FILTER (WHERE x.up), '[]') AS upstreams,
           coalesce(jsonb_agg(x.edge ORDER BY x.name) FILTER (WHERE NOT x.up), '[]') AS downstreams,
           string_agg((x.edge->>'job') || ' ' || upper(x.edge->>'on'), ' AND ' ORDER BY x.name)
               FILTER (WHERE x.up) AS after_text
    FROM (SELECT e.job_id = j.job_id AS up, k.schema_name || '.' || k.job_name AS name,
                 CASE WHEN radix._owner_visible(k.owner_oid)
                      THEN jsonb_build_object('job', quote_ident(k.schema_name) || '.' || quote_ident(k.job_name),
                                              'on', e.condition, 'job_id', k.job_id)
                      ELSE jsonb_build_object('job', '(hidden)', 'on', e.condition) END AS edge
          FROM radix.job_edges e
          JOIN radix.jobs k ON k.job_id = CASE WHEN e.job_id = j.job_id THEN e.upstream_id ELSE e.job_id END
          WHERE e.job_id = j.job_id OR e.upstream_id = j.job_id) x
) g
WHERE radix._owner_visible(j.owner_oid);

-- Does `job` exist, among the jobs the caller sees (for CREATE OR REPLACE: replace it, or create it)? As the
-- caller now: a name the caller does not see goes on to admission, which refuses it as CREATE JOB would (no
-- CREATE on its schema, or already exists).
CREATE OR REPLACE FUNCTION radix._job_exists(job text) RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
SET jit = off
RETURN EXISTS (SELECT 1 FROM radix.job_overview o, radix._split_qualified(job, 'job') AS p(parts)
               WHERE o.schema_name = p.parts[1] AND o.job_name = p.parts[2]);

CREATE OR REPLACE VIEW radix.job_history WITH (security_barrier) AS
SELECT h.history_id, h.job_id, quote_ident(j.schema_name) || '.' || quote_ident(j.job_name) AS name,
       h.definition_version, h.planned_ns, radix.from_ns(h.planned_ns) AS planned_at, h.attempt,
       h.idempotency_key, h.status, h.node, h.atomic, h.started_at, h.finished_at,
       h.finished_at - h.started_at AS duration, h.error, h.run_kind
FROM radix.radix_system_job_history h JOIN radix.jobs j USING (job_id)
WHERE radix._owner_visible(j.owner_oid);
