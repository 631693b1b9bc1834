"""What the console reads and does, one database connection at a time.

Invariants:
- Every read goes through radix.job_overview, job_history, document_overview, document_processes and
  node_overview (rows for operators only): PostgreSQL decides which rows the connected role
  sees, so the console shows a role nothing it could not select itself.
- Every action calls the same SQL function a SQL user calls (radix.run_job, radix.alter_job,
  radix.apply_documents), so admission is the database's.
- Every statement is fixed text with typed parameters, schema-qualified, on a connection with search_path
  pinned and a statement timeout (auth.bounded_dsn); result sizes are bounded (LIMIT everywhere).
- Lists are paged in the database (LIMIT/OFFSET over one ordered query per database).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from radixjobs.db import first_line
from radixjobs.documents import store

Conn = psycopg.Connection[dict[str, Any]]
Row = dict[str, Any]

RECENT_ATTEMPTS = 20_000  # the overview's last hour is read from at most this many newest attempts
STRIP = 50
HISTORY_PAGE = 100
TIMELINE_MAX = 2000

ITEMS = """
WITH items AS (
    SELECT 'job'::pg_catalog.text AS kind, o.name, o.job_id::pg_catalog.text AS key, o.principal,
           o.schedule_kind, o.interval_ns, o.at_ns, o.cron_expression, o.cron_time_zone,
           o.schedule AS schedule_text, o.enabled, o.next_run_at,
           CASE WHEN NOT o.enabled THEN 'disabled' ELSE COALESCE(o.status, 'scheduled') END AS state
    FROM radix.job_overview o
    UNION ALL
    SELECT 'document', 'doc:' OPERATOR(pg_catalog.||) d.num, d.num, d.principal, 'document', NULL, NULL, NULL,
           NULL, d.props OPERATOR(pg_catalog.->>) 'INTERVAL',
           d.status OPERATOR(pg_catalog.=) 'CRON_TABLE_ACTIVE', d.next_run_at,
           pg_catalog.lower(pg_catalog.replace(d.status, 'CRON_TABLE_', ''))
    FROM radix.document_overview d
)
SELECT {columns} FROM items
WHERE (%(state)s::pg_catalog.text IS NULL OR state OPERATOR(pg_catalog.=) %(state)s::pg_catalog.text)
  AND (%(text)s::pg_catalog.text IS NULL
       OR pg_catalog.strpos(pg_catalog.lower(name OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) principal),
                            pg_catalog.lower(%(text)s::pg_catalog.text)) OPERATOR(pg_catalog.>) 0)
"""
COUNT_ITEMS = ITEMS.format(columns="pg_catalog.count(*) AS n")
PAGE_ITEMS = ITEMS.format(columns="*, pg_catalog.count(*) OVER () AS total_count") + """
ORDER BY name COLLATE "C", kind LIMIT %(limit)s::pg_catalog.int8 OFFSET %(offset)s::pg_catalog.int8"""

JOB_STRIPS = """
SELECT k.key, (SELECT pg_catalog.array_agg(x.status ORDER BY x.history_id)
               FROM (SELECT h.status, h.history_id FROM radix.job_history h
                     WHERE h.job_id OPERATOR(pg_catalog.=) k.key::pg_catalog.uuid
                     ORDER BY h.history_id DESC LIMIT %s::pg_catalog.int8) x) AS strip
FROM pg_catalog.unnest(%s::pg_catalog.text[]) AS k(key)"""
DOCUMENT_STRIPS = """
SELECT k.key, (SELECT pg_catalog.array_agg(x.status ORDER BY x.id)
               FROM (SELECT p.status, p.id FROM radix.document_processes p
                     WHERE p.num OPERATOR(pg_catalog.=) k.key
                     ORDER BY p.id DESC LIMIT %s::pg_catalog.int8) x) AS strip
FROM pg_catalog.unnest(%s::pg_catalog.text[]) AS k(key)"""

RECENT = f"""
SELECT r.status, r.attempt, r.started_at, r.error OPERATOR(pg_catalog.->>) 'category' AS category,
       pg_catalog.date_part('epoch', r.started_at OPERATOR(pg_catalog.-) r.planned_at) AS lateness_s
FROM (SELECT h.status, h.attempt, h.started_at, h.planned_at, h.error FROM radix.job_history h
      ORDER BY h.history_id DESC LIMIT {RECENT_ATTEMPTS}) r
WHERE r.started_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '1 hour')"""
CLAIMS = """
SELECT o.lease_node AS node, pg_catalog.count(*) AS claims FROM radix.job_overview o
WHERE o.status OPERATOR(pg_catalog.=) 'running' GROUP BY o.lease_node"""
NODES = """
SELECT n.node_id, n.hostname, n.pid, n.last_seen AS registered_at, n.alive
FROM radix.node_overview n ORDER BY n.node_id COLLATE "C" LIMIT 100"""
LIVE = """
SELECT h.history_id, h.job_id, h.name, h.attempt, h.started_at, h.planned_at, h.idempotency_key, h.node,
       o.deadline_ms, pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
       h.started_at) AS elapsed_s
FROM radix.job_history h JOIN radix.job_overview o USING (job_id)
WHERE h.status OPERATOR(pg_catalog.=) 'running' ORDER BY h.started_at LIMIT 500"""
LIVE_PROCESSES = """
SELECT p.id, p.num, p.type, p.target, p.started_at, p.node,
       pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) p.started_at) AS elapsed_s
FROM radix.document_processes p WHERE p.status OPERATOR(pg_catalog.=) 'running' ORDER BY p.started_at LIMIT 500"""
JOB = "SELECT * FROM radix.job_overview o WHERE o.job_id OPERATOR(pg_catalog.=) %s::pg_catalog.uuid"
HISTORY = """
SELECT h.history_id, h.planned_at, h.attempt, h.idempotency_key, h.status, h.node, h.atomic, h.started_at,
       h.finished_at, pg_catalog.date_part('epoch', h.duration) AS duration_s,
       pg_catalog.date_part('epoch', h.started_at OPERATOR(pg_catalog.-) h.planned_at) AS lateness_s, h.error
FROM radix.job_history h
WHERE h.job_id OPERATOR(pg_catalog.=) %(job)s::pg_catalog.uuid
  AND (%(status)s::pg_catalog.text IS NULL OR h.status OPERATOR(pg_catalog.=) %(status)s::pg_catalog.text)
  AND (%(before)s::pg_catalog.int8 IS NULL OR h.history_id OPERATOR(pg_catalog.<) %(before)s::pg_catalog.int8)
  AND (%(since_s)s::pg_catalog.float8 IS NULL OR h.started_at OPERATOR(pg_catalog.>)
       (pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => %(since_s)s::pg_catalog.float8)))
ORDER BY h.history_id DESC LIMIT %(limit)s::pg_catalog.int8"""
RUNNING_SINCE = """
SELECT k.key, (SELECT h.started_at FROM radix.job_history h
               WHERE h.job_id OPERATOR(pg_catalog.=) k.key::pg_catalog.uuid
                 AND h.status OPERATOR(pg_catalog.=) 'running'
               ORDER BY h.history_id DESC LIMIT 1) AS started_at
FROM pg_catalog.unnest(%s::pg_catalog.text[]) AS k(key)"""
DOCUMENT = "SELECT * FROM radix.document_overview d WHERE d.num OPERATOR(pg_catalog.=) %s::pg_catalog.text"
PROCESSES = """
SELECT p.*, pg_catalog.date_part('epoch', p.duration) AS duration_s FROM radix.document_processes p
WHERE p.num OPERATOR(pg_catalog.=) %s::pg_catalog.text ORDER BY p.id DESC LIMIT 50"""


def connect(dsn: str) -> Conn:
    """A dict-row autocommit connection to an already bounded DSN (auth.bounded_dsn / role_dsn)."""
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)


def count_items(conn: Conn, state: str | None, text: str | None) -> int:
    row = conn.execute(COUNT_ITEMS, {"state": state, "text": text}).fetchone()
    return int(row["n"]) if row else 0


def page_items(conn: Conn, state: str | None, text: str | None, offset: int, limit: int) -> tuple[list[Row], int]:
    """One page of jobs and documents, each with its last ``STRIP`` outcomes (oldest first) and the start
    of its running attempt (``running_since``), and how many match in all (one scan when the page has
    rows; ``limit`` 0: the count only)."""
    rows = conn.execute(PAGE_ITEMS, {"state": state, "text": text, "offset": offset, "limit": limit}).fetchall() \
        if limit > 0 else []
    total = int(rows[0]["total_count"]) if rows else count_items(conn, state, text)
    strips: dict[tuple[str, str], list[str]] = {}
    for kind, query in (("job", JOB_STRIPS), ("document", DOCUMENT_STRIPS)):
        keys = [r["key"] for r in rows if r["kind"] == kind]
        if keys:
            for s in conn.execute(query, (STRIP, keys)).fetchall():
                strips[(kind, s["key"])] = list(s["strip"] or [])
    started = running_since(conn, [r["key"] for r in rows if r["kind"] == "job" and r["state"] == "running"])
    for row in rows:
        row["strip"] = strips.get((row["kind"], row["key"]), [])
        row["last_outcome"] = row["strip"][-1] if row["strip"] else None
        row["running_since"] = started.get(row["key"]) if row["kind"] == "job" else None
    return rows, total


def overview(conn: Conn) -> Row:
    """Last hour's attempts (bounded), claims held per node, the nodes (None: the role is no operator and
    sees no node, see radix._is_operator)."""
    recent = conn.execute(RECENT).fetchall()
    claims = {r["node"]: int(r["claims"]) for r in conn.execute(CLAIMS).fetchall()}
    row = conn.execute("SELECT radix._is_operator() AS operator").fetchone()
    nodes = conn.execute(NODES).fetchall() if row and row["operator"] else None
    return {"recent": recent, "claims": claims, "nodes": nodes}


def live(conn: Conn) -> Row:
    return {"attempts": conn.execute(LIVE).fetchall(), "processes": conn.execute(LIVE_PROCESSES).fetchall()}


def job(conn: Conn, job_id: str) -> Row | None:
    return conn.execute(JOB, (job_id,)).fetchone()


def running_since(conn: Conn, job_ids: list[str]) -> dict[str, Any]:
    """When each job's newest running attempt started (None: none is running, or not yet visible: an
    atomic tick's attempt row commits with the tick)."""
    if not job_ids:
        return {}
    return {r["key"]: r["started_at"] for r in conn.execute(RUNNING_SINCE, (job_ids,)).fetchall()}


def history(conn: Conn, job_id: str, status: str | None = None, before: int | None = None,
            since_s: float | None = None, limit: int = HISTORY_PAGE) -> list[Row]:
    return conn.execute(HISTORY, {"job": job_id, "status": status, "before": before, "since_s": since_s,
                                  "limit": limit}).fetchall()


def document(conn: Conn, num: str) -> Row | None:
    return conn.execute(DOCUMENT, (num,)).fetchone()


def processes(conn: Conn, num: str) -> list[Row]:
    return conn.execute(PROCESSES, (num,)).fetchall()


# -- actions: the database's own functions; the result is one line either way --------------------------
def _outcome(conn: Conn, query: Any, params: Sequence[Any]) -> tuple[bool, str]:
    try:
        row = conn.execute(query, params).fetchone()
    except psycopg.Error as exc:
        return False, first_line(exc)
    return True, "" if row is None else str(next(iter(row.values())))


def run_job(conn: Conn, name: str) -> tuple[bool, str]:
    ok, value = _outcome(conn, "SELECT radix.run_job(%s::pg_catalog.text) AS result", (name,))
    return ok, f"{name}: run requested ({value})" if ok else value


def set_enabled(conn: Conn, name: str, enabled: bool) -> tuple[bool, str]:
    ok, value = _outcome(conn, "SELECT radix.alter_job(%s::pg_catalog.text, %s::pg_catalog.bool) AS result",
                         (name, enabled))
    return ok, f"{name}: {'enabled' if enabled else 'disabled'}" if ok else value


def set_document_status(conn: Conn, num: str, active: bool) -> tuple[bool, str]:
    """Apply the document again as it is, with the new status (maintained properties are ignored)."""
    row = document(conn, num)
    if row is None:
        return False, f"document NUM {num} does not exist or is not visible to you"
    doc = store.to_document(row)
    doc["status"] = "CRON_TABLE_ACTIVE" if active else "CRON_TABLE_PASSIVE"
    for key in ("SYS_PROCESS_ID", "COUNT_ERROR", "LAST_RUN", "NEXT_RUN", "DAILY_START_TIME", "DAILY_END_TIME",
                "ERROR_TEXT"):
        doc["props"].pop(key, None)
    ok, value = _outcome(conn, "SELECT radix.apply_documents(%s::pg_catalog.jsonb) AS result", (Jsonb([doc]),))
    return ok, f"document {num}: {doc['status']}" if ok else value
