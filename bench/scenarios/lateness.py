"""Lateness: jobs EVERY 1 second run by radixjobs serve; procedure start − planned time, ticks missed.

The procedure (bench.tick) records clock_timestamp() as its first statement and the planned time from
radix.current_job_scheduled_at(); both come from the database clock. Only ticks planned inside the
measurement window count (it starts a few seconds after the daemon, so start-up is not measured).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import time
from typing import Any

import psutil

from harness import BenchDatabase, CpuMeter, Daemon, clone_jobs, percentile
from scenarios import baseline

NS = 1_000_000_000

CREATE_JOB = """
SELECT radix.create_job('bench.l0', jsonb_build_object('every', '1 second'), %s, 'bench.tick')
"""

# Per job: ticks planned inside [w0, w1) (its grid is anchor + k·interval), and those that ran.
TICKS = """
WITH w AS (SELECT %(w0)s::bigint AS w0, %(w1)s::bigint AS w1),
expected AS (
    SELECT s.job_id,
           greatest(0, (w.w1 - 1 - s.anchor_ns) / j.interval_ns - (w.w0 - 1 - s.anchor_ns) / j.interval_ns) AS n
    FROM radix.radix_system_job_state s JOIN radix.jobs j USING (job_id), w
    WHERE j.schema_name = 'bench' AND j.job_name LIKE 'l%%'
),
ran AS (
    SELECT t.job, radix.to_ns(t.planned) AS planned_ns,
           extract(epoch FROM t.started - t.planned) * 1000 AS late_ms
    FROM bench.ticks t, w
    WHERE radix.to_ns(t.planned) >= w.w0 AND radix.to_ns(t.planned) < w.w1
)
SELECT (SELECT sum(n) FROM expected), (SELECT count(*) FROM ran),
       (SELECT count(*) FROM (SELECT 1 FROM ran GROUP BY job, planned_ns HAVING count(*) > 1) d),
       (SELECT array_agg(late_ms::float8) FROM ran)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    baseline.add_arguments(parser)
    parser.add_argument("--jobs", type=int, default=200, help="jobs EVERY 1 second (default 200)")
    parser.add_argument("--seconds", type=float, default=60.0, help="measurement window (default 60)")
    parser.add_argument("--phase", choices=("spread", "aligned"), default="spread",
                        help="ticks spread evenly over the second (default), or all jobs due at the same instant")
    parser.add_argument("--concurrency", type=int, default=16, help="per-database concurrency (daemon default 16)")
    parser.add_argument("--down-and-hung-targets", action="store_true",
                        help="serve two more targets beside the database: nothing listening on a free loopback "
                             "port, and a loopback listener that never answers (docs/scaling.md)")


def other_targets(stack: contextlib.ExitStack) -> list[str]:
    """``--dsn`` arguments of a target that is down and one that hangs (its socket lives in ``stack``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down_port = probe.getsockname()[1]
    hung = stack.enter_context(socket.socket())
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    return ["--dsn", f"host=127.0.0.1 port={down_port} dbname=down user=nobody",
            "--dsn", f"host=127.0.0.1 port={hung.getsockname()[1]} dbname=hung user=nobody"]


def create_jobs(db: BenchDatabase, jobs: int, phase: str) -> None:
    """``jobs`` jobs EVERY 1 second calling bench.tick (l0 through radix.create_job, the others its clones), their
    ticks spread evenly over the second or (``aligned``) all due at the same instant."""
    with db.connect() as conn:
        conn.execute(CREATE_JOB.encode(), (db.principal,))
        spread_ns = (jobs - 1) * NS // jobs if phase == "spread" else 0
        clone_jobs(conn, "l0", "l", jobs - 1, vary=False, spread_ns=spread_ns)


def start_daemon(db: BenchDatabase, node_id: str, concurrency: int, others: list[str]) -> Daemon:
    """``radixjobs serve`` with ``concurrency`` slots for the database (and ``others``: other_targets)."""
    node = max(32, concurrency) * (3 if others else 1)  # the database's cluster keeps its default share
    return Daemon(db.dsn, node_id, *others, "--per-database-concurrency", str(concurrency),
                  "--concurrency", str(node))


def window_ticks(db: BenchDatabase, w0: int, w1: int) -> dict[str, Any]:
    """The ticks planned inside [w0, w1) (ns): expected, run, missed, duplicated, and their lateness."""
    with db.connect() as conn:
        row = conn.execute(TICKS.encode(), {"w0": w0, "w1": w1}).fetchone()
    assert row is not None
    expected, ran, duplicates, late = int(row[0] or 0), int(row[1]), int(row[2]), list(row[3] or [])
    return {"ticks_expected": expected, "ticks_run": ran, "ticks_missed": expected - ran,
            "duplicate_ticks": duplicates, **lateness_figures(late)}


def lateness_figures(late: list[float]) -> dict[str, float]:
    """p50 / p99 / max of lateness in ms (none when no tick ran)."""
    if not late:
        return {}
    return {"lateness_p50_ms": round(percentile(late, 0.50), 2), "lateness_p99_ms": round(percentile(late, 0.99), 2),
            "lateness_max_ms": round(max(late), 2)}


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    one = baseline.measure(db, 1, args.baseline_seconds)
    create_jobs(db, args.jobs, args.phase)
    stack = contextlib.ExitStack()
    others = other_targets(stack) if args.down_and_hung_targets else []
    daemon = start_daemon(db, "bench-lateness", args.concurrency, others)
    try:
        time.sleep(3.0)  # start-up: connections, first claims
        w0 = int(db.scalar("SELECT radix.to_ns(clock_timestamp())"))
        meter = CpuMeter(db, daemon.proc.pid)
        time.sleep(args.seconds)
        cpu = meter.used()
        w1 = w0 + int(args.seconds * NS)
        time.sleep(2.0)  # the window's last ticks finish
        rss = psutil.Process(daemon.proc.pid).memory_info().rss
    finally:
        daemon.stop()
        stack.close()
    ticks = window_ticks(db, w0, w1)
    late = {key: ticks.pop(key) for key in list(ticks) if key.startswith("lateness_")}
    result: dict[str, Any] = {
        "jobs": args.jobs, "phase": args.phase, "seconds": args.seconds, "concurrency": args.concurrency, **ticks,
        "down_and_hung_targets": bool(others),
        "daemon_cpu_percent_of_a_core": round(100 * cpu["daemon"] / args.seconds, 1),
        "server_cpu_percent_of_a_core": round(100 * cpu["server"] / args.seconds, 1),
        "daemon_rss_mb": round(rss / 2**20, 1), **late,
    }
    return {"lateness": result, "baseline": {"one_connection_commits_per_s": round(one)}}
