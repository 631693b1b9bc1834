"""Job DDL and the job catalog from Python: every path calls the database's admission functions.

The parser turns text into a statement; this module sends it, as structured JSON with bound parameters,
to ``radix.create_job`` / ``radix.alter_job`` / ``radix.drop_job`` / ``radix.run_job`` /
``radix.backfill_job`` — the same functions a SQL user calls — so the checks are the database's, in one
transaction per statement. Cron ticks of a backfill are the one thing computed here (the database cannot
evaluate cron); the database checks that they lie in the range.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from radixjobs import ddl, schedule, timewords
from radixjobs.errors import AdmissionError
from radixjobs.model import (
    AfterSchedule,
    AlterJob,
    AlterJobGroup,
    AtSchedule,
    CallArgument,
    CreateJob,
    CreateJobGroup,
    DropJobGroup,
    EverySchedule,
    GroupStatement,
    JobStatement,
    QualifiedName,
    RunJob,
    Schedule,
)

Conn = psycopg.Connection[Any]
MAX_REQUESTED_TICKS = 10_000  # radix.max_requested_ticks()


def schedule_json(schedule: Schedule) -> dict[str, Any]:
    """The admission function's schedule document for a parsed schedule (nanosecond forms)."""
    if isinstance(schedule, EverySchedule):
        out: dict[str, Any] = {"every_ns": schedule.interval_ns}
        if schedule.starting_at_ns is not None:
            out["starting_at_ns"] = schedule.starting_at_ns
        return out
    if isinstance(schedule, AtSchedule):
        return {"at_ns": schedule.at_ns}
    if isinstance(schedule, AfterSchedule):
        return {"after": [{"job": str(edge.job), "on": edge.on} for edge in schedule.upstreams]}
    return {"cron": schedule.expression, "time_zone": schedule.time_zone}


def _admission(conn: Conn, query: str, params: Sequence[Any]) -> Any:
    """Run one admission call in its own transaction; PostgreSQL errors become AdmissionError."""
    try:
        with conn.transaction():
            row = conn.execute(query.encode(), params).fetchone()
    except psycopg.Error as exc:
        diag = exc.diag
        text = diag.message_primary or str(exc).splitlines()[0]
        if diag.message_detail:
            text += f" ({diag.message_detail})"
        if diag.message_hint:
            text += f". Hint: {diag.message_hint}"
        raise AdmissionError(text, exc.sqlstate or "RX000") from None
    return row[0] if row else None


def create_job(conn: Conn, stmt: CreateJob, *, deadline_ms: int | None = None) -> uuid.UUID:
    """CREATE [OR REPLACE] JOB; returns the job id (the existing one with IF NOT EXISTS or OR REPLACE).
    ``deadline_ms`` (the timeout) wins over the statement's WITH (timeout = ...); neither: 240 s."""
    args = [a.to_json() for a in stmt.arguments]
    options = stmt.options_json()
    if deadline_ms is not None:
        options["timeout"] = deadline_ms
    result = _admission(
        conn,
        "SELECT radix.create_job(%s, %s, %s, %s, %s, %s, %s, options => %s, or_replace => %s)",
        (str(stmt.name), Jsonb(schedule_json(stmt.schedule)), stmt.principal, str(stmt.procedure),
         Jsonb(args), stmt.enabled, stmt.if_not_exists, Jsonb(options), stmt.or_replace),
    )
    return uuid.UUID(str(result))


def alter_job(conn: Conn, name: QualifiedName | str, *, enabled: bool | None = None,
              schedule: Schedule | None = None, run_as: str | None = None,
              procedure: QualifiedName | str | None = None, arguments: Sequence[CallArgument] | None = None,
              options: dict[str, str | int] | None = None, reset: Sequence[str] = (),
              rename_to: QualifiedName | str | None = None) -> bool:
    """ALTER JOB: ENABLE/DISABLE, SET SCHEDULE, SET RUN AS, SET CALL (``procedure`` with ``arguments``),
    SET (``options``), RESET (``reset``), RENAME TO. True when the job changed (definition_version bumped)."""
    return bool(_admission(
        conn,
        "SELECT radix.alter_job(%s, enabled => %s, schedule => %s, run_as => %s, procedure => %s, "
        "arguments => %s, options => %s, reset => %s, rename_to => %s)",
        (str(name), enabled, None if schedule is None else Jsonb(schedule_json(schedule)), run_as,
         None if procedure is None else str(procedure),
         None if procedure is None else Jsonb([a.to_json() for a in arguments or ()]),
         Jsonb(options) if options else None, list(reset) or None,
         None if rename_to is None else str(rename_to))))


def run_job(conn: Conn, name: QualifiedName | str) -> str:
    """RUN JOB: queue one attempt now (it waits for a running one); returns its idempotency key."""
    return str(_admission(conn, "SELECT radix.run_job(%s::pg_catalog.text)", (str(name),)))


def backfill_job(conn: Conn, name: QualifiedName | str, start: dt.datetime | int, end: dt.datetime | int) -> int:
    """RUN JOB … FOR RANGE: queue every tick of the schedule in [start, end) (and not after now) that has
    not succeeded, oldest first; returns how many. Cron ticks are computed here, with the scheduler's code."""
    start_ns, end_ns = (_as_ns(v) for v in (start, end))
    job = get_job(conn, name)
    ticks: list[int] | None = None
    if job is not None and job["schedule_kind"] == "cron":
        ticks = []
        tick = start_ns - 1
        while True:
            tick = schedule.next_cron_tick(job["cron_expression"], job["cron_time_zone"], tick)
            if tick >= end_ns:
                break
            ticks.append(tick)
            if len(ticks) > MAX_REQUESTED_TICKS:
                raise AdmissionError(f"RUN JOB would queue more than {MAX_REQUESTED_TICKS} ticks, above the limit "
                                     "per statement. Hint: split the range.", "54000")
    return int(_admission(
        conn, "SELECT radix.backfill_job(%s::pg_catalog.text, radix.from_ns(%s::pg_catalog.int8), "
        "radix.from_ns(%s::pg_catalog.int8), %s::pg_catalog.int8[])",
        (str(name), start_ns, end_ns, ticks)))


def _as_ns(value: dt.datetime | int) -> int:
    if isinstance(value, int):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def drop_job(conn: Conn, name: QualifiedName | str, *, if_exists: bool = False, cascade: bool = False) -> bool:
    """DROP JOB; False when it did not exist (with IF EXISTS)."""
    return bool(_admission(conn, "SELECT radix.drop_job(%s, %s, %s)", (str(name), if_exists, cascade)))


def create_job_group(conn: Conn, name: str, max_running: int, *, if_not_exists: bool = False) -> bool:
    """CREATE JOB GROUP: owned by the current role; False when it existed (with IF NOT EXISTS)."""
    return bool(_admission(conn, "SELECT radix.create_job_group(%s, %s, %s)",
                           (name, Jsonb({"max_running": max_running}), if_not_exists)))


def alter_job_group(conn: Conn, name: str, max_running: int | None) -> bool:
    """ALTER JOB GROUP … SET (max_running = N), or RESET (max_running) when ``max_running`` is None."""
    if max_running is None:
        return bool(_admission(conn, "SELECT radix.alter_job_group(%s, reset => %s)", (name, ["max_running"])))
    return bool(_admission(conn, "SELECT radix.alter_job_group(%s, options => %s)",
                           (name, Jsonb({"max_running": max_running}))))


def drop_job_group(conn: Conn, name: str, *, if_exists: bool = False) -> bool:
    """DROP JOB GROUP (refused while jobs are in it); False when it did not exist (with IF EXISTS)."""
    return bool(_admission(conn, "SELECT radix.drop_job_group(%s, %s)", (name, if_exists)))


def list_job_groups(conn: Conn) -> list[dict[str, Any]]:
    """The job groups the current role may see, by name, with their jobs and running attempts."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM radix.job_group_overview ORDER BY name").fetchall()


def _perform_group(conn: Conn, stmt: GroupStatement) -> str:
    if isinstance(stmt, CreateJobGroup):
        create_job_group(conn, stmt.name, stmt.max_running, if_not_exists=stmt.if_not_exists)
        return "CREATE JOB GROUP"
    if isinstance(stmt, AlterJobGroup):
        alter_job_group(conn, stmt.name, stmt.max_running)
        return "ALTER JOB GROUP"
    drop_job_group(conn, stmt.name, if_exists=stmt.if_exists)
    return "DROP JOB GROUP"


def perform(conn: Conn, stmt: JobStatement) -> str:
    """Carry out a parsed statement; returns its command tag."""
    if isinstance(stmt, CreateJobGroup | AlterJobGroup | DropJobGroup):
        return _perform_group(conn, stmt)
    if isinstance(stmt, CreateJob):
        create_job(conn, stmt)
        return "CREATE JOB"
    if isinstance(stmt, AlterJob):
        alter_job(conn, stmt.name, enabled=stmt.enabled, schedule=stmt.schedule, run_as=stmt.principal,
                  procedure=stmt.procedure, arguments=stmt.arguments, options=dict(stmt.options), reset=stmt.reset,
                  rename_to=stmt.rename_to)
        return "ALTER JOB"
    if isinstance(stmt, RunJob):
        if stmt.range_from_ns is None or stmt.range_to_ns is None:
            run_job(conn, stmt.name)
            return "RUN JOB"
        return f"RUN JOB {backfill_job(conn, stmt.name, stmt.range_from_ns, stmt.range_to_ns)}"
    drop_job(conn, stmt.name, if_exists=stmt.if_exists, cascade=stmt.cascade)
    return "DROP JOB"


def execute_job_ddl(conn: Conn, text: str) -> str:
    """Parse and carry out one job DDL statement; returns its command tag."""
    return perform(conn, ddl.parse_job_statement(text))


def describe_timeout(ms: int) -> str:
    """A job's timeout as WITH (timeout = ...) would give it: '2 hours', '1 day 30 minutes', '4 minutes'."""
    return timewords.interval_words(int(ms) * 1_000_000)


LIST_COLUMNS = ("name", "schedule", "principal", "procedure", "enabled", "definition_version", "status",
                "next_run_at")


def list_jobs(conn: Conn) -> list[dict[str, Any]]:
    """The jobs the current role may see (its own; all for a superuser), ordered by name."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM radix.job_overview ORDER BY schema_name, job_name").fetchall()


def get_job(conn: Conn, name: QualifiedName | str) -> dict[str, Any] | None:
    """One job by qualified name (``schema.name``), or None."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            # qualified: the pg_cron import asks it on a session with its user's own search_path
            "SELECT o.* FROM radix.job_overview o, pg_catalog.parse_ident(%s::pg_catalog.text) AS p "
            "WHERE pg_catalog.cardinality(p) OPERATOR(pg_catalog.=) 2 AND o.schema_name OPERATOR(pg_catalog.=) p[1] "
            "AND o.job_name OPERATOR(pg_catalog.=) p[2]",
            (str(name),)).fetchone()


def job_history(conn: Conn, name: QualifiedName | str, limit: int = 50, *, statuses: Sequence[str] = (),
                since: dt.datetime | None = None) -> list[dict[str, Any]]:
    """The newest attempts of a job, newest first: those with one of ``statuses`` (all when empty) that
    started at or after ``since`` (all when None)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT h.* FROM radix.job_history h JOIN radix.job_overview o USING (job_id), "
            "pg_catalog.parse_ident(%s::pg_catalog.text) p "
            "WHERE pg_catalog.cardinality(p) OPERATOR(pg_catalog.=) 2 "
            "AND o.schema_name OPERATOR(pg_catalog.=) p[1] AND o.job_name OPERATOR(pg_catalog.=) p[2] "
            "AND (pg_catalog.cardinality(%s::pg_catalog.text[]) OPERATOR(pg_catalog.=) 0 "
            "     OR h.status OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[])) "
            "AND (%s::pg_catalog.timestamptz IS NULL "
            "     OR h.started_at OPERATOR(pg_catalog.>=) %s::pg_catalog.timestamptz) "
            "ORDER BY h.history_id DESC LIMIT %s::pg_catalog.int8",
            (str(name), list(statuses), list(statuses), since, since, limit)).fetchall()


def resolve_since(conn: Conn, text: str) -> dt.datetime:
    """``--since``: an ISO 8601 timestamp, or an interval before now (``1 hour``, ``30 min``), as the
    database reads it; ValueError names the problem."""
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        pass
    else:
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    try:
        with conn.transaction():
            row = conn.execute("SELECT pg_catalog.now() OPERATOR(pg_catalog.-) %s::pg_catalog.interval",
                               (text,)).fetchone()
    except psycopg.DataError:
        row = None
    if not row or not isinstance(row[0], dt.datetime):
        raise ValueError(f"expected an ISO timestamp (2026-12-01T09:00:00Z) or an interval (1 hour), got {text!r}")
    return row[0]


def describe_arguments(arguments: list[dict[str, Any]]) -> str:
    """Arguments as the CALL will pass them: ``name => value::type``."""
    parts = []
    for arg in arguments:
        value = "NULL" if arg.get("value") is None else json.dumps(arg["value"])
        prefix = f"{arg['name']} => " if arg.get("by_name") else ""
        parts.append(f"{prefix}{value}::{arg['type']}")
    return ", ".join(parts)

