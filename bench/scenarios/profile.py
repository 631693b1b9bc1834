"""Profile: where the server's time per attempt goes, by radix function and by statement (the throughput run).

The throughput scenario's workload (``--jobs`` one-time atomic jobs, all due at once, one ``radixjobs serve``)
with PostgreSQL's own accounting on: ``track_functions = all`` (pg_stat_user_functions: calls, total and self
time of each radix function) and pg_stat_statements with ``track = all`` (top-level and nested statements).
Times are server wall time per attempt, in µs, and include waits (locks, I/O); they are shares, not CPU. The
embedded server is started with pg_stat_statements preloaded; with ``--dsn`` the server must preload it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from psycopg import sql

from harness import BenchDatabase, CpuMeter, Daemon, clone_jobs, wait_for
from scenarios.throughput import create_job

# Settings of the embedded server this scenario needs (bench/run.py merges them under --setting).
SETTINGS = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}

FUNCTIONS = """
SELECT funcname, calls, total_time, self_time FROM pg_catalog.pg_stat_user_functions
WHERE schemaname = 'radix' ORDER BY self_time DESC LIMIT %s
"""
STATEMENTS = """
SELECT toplevel, calls, total_exec_time + total_plan_time,
       left(regexp_replace(query, '\\s+', ' ', 'g'), 100)
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
ORDER BY toplevel DESC, total_exec_time + total_plan_time DESC
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=5_000, help="one-time jobs to run (default 5000)")
    parser.add_argument("--top", type=int, default=20, help="rows of each list (default 20)")
    parser.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="serve --event-loop (default asyncio)")


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    with db.connect() as conn:
        conn.execute(b"CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute(b"INSERT INTO bench.counters (id) SELECT g FROM generate_series(0, %s) g", (args.jobs - 1,))
        create_job(conn, db.principal, False)  # the default options: no tick batches
        clone_jobs(conn, "t0", "t", args.jobs - 1, vary=True)
        conn.execute(b"UPDATE radix.radix_system_job_state SET due_ns = NULL")
        conn.execute(sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(sql.Identifier(conn.info.dbname)))
    daemon = Daemon(db.dsn, "bench-profile", "--event-loop", args.event_loop)
    try:
        meter = CpuMeter(db, daemon.proc.pid)
        with db.connect() as conn:
            conn.execute(b"SELECT pg_stat_statements_reset(), pg_catalog.pg_stat_reset()")
            conn.execute(b"UPDATE radix.radix_system_job_state SET due_ns = planned_ns")
            conn.execute(b"NOTIFY radix_jobs")
        started = time.monotonic()
        wait_for(lambda: db.scalar("SELECT count(*) = %s FROM radix.radix_system_job_history "
                                   "WHERE finished_at IS NOT NULL", (args.jobs,)),
                 timeout=600, interval=0.25, message="every attempt to finish")
        elapsed = time.monotonic() - started
        used = meter.used()
    finally:
        daemon.stop()
    n = args.jobs
    with db.connect() as conn:
        functions = conn.execute(FUNCTIONS.encode(), (args.top,)).fetchall()
        statements = conn.execute(STATEMENTS.encode()).fetchall()
    per = [{"function": name, "calls_per_attempt": round(calls / n, 2), "total_us": round(total * 1000 / n, 1),
            "self_us": round(own * 1000 / n, 1)} for name, calls, total, own in functions]

    def listed(top: bool) -> list[dict[str, Any]]:
        return [{"calls_per_attempt": round(calls / n, 2), "us": round(ms * 1000 / n, 1), "query": query}
                for toplevel, calls, ms, query in statements if toplevel is top][:args.top]

    return {"profile": {"jobs": n, "attempts_per_s": round(n / elapsed),
                        "daemon_cpu_us_per_attempt": round(used["daemon"] / n * 1e6),
                        "server_cpu_us_per_attempt": round(used["server"] / n * 1e6)},
            "functions": per, "statements": listed(True), "nested_statements": listed(False)}


def render(document: dict[str, Any]) -> str:
    head = document["profile"]
    lines = [f"{head['jobs']} attempts at {head['attempts_per_s']}/s; CPU per attempt: daemon "
             f"{head['daemon_cpu_us_per_attempt']} µs, server {head['server_cpu_us_per_attempt']} µs",
             "", "radix functions, server µs per attempt (calls per attempt, total, self):"]
    lines += [f"  {f['function']:<28} {f['calls_per_attempt']:>6} {f['total_us']:>8} {f['self_us']:>8}"
              for f in document["functions"]]
    for key, title in (("statements", "top-level statements"), ("nested_statements", "nested statements")):
        lines += ["", f"{title}, server µs per attempt (calls per attempt, µs, query):"]
        lines += [f"  {s['calls_per_attempt']:>6} {s['us']:>8}  {s['query']}" for s in document[key]]
    return "\n".join(lines)
