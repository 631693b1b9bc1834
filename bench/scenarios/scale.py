"""Scale: 1,000,000 defined jobs (most not due for hours, a few due every second) under radixjobs serve.

Jobs are inserted with the bulk shortcut (harness.CLONE_JOBS: one job made by radix.create_job, the rest
copied row by row into radix.jobs and radix.radix_system_job_state as superuser, the same rows
create_job writes), because admitting a million jobs one by one takes hours. Measured: the daemon's CPU
(% of one core) and resident memory over an idle window, and the two queries that look for due work, the
claim (radix.claim_due, the lease path) and the finder (radix.find_ticks, the one-transaction tick): their
plans (auto_explain of the statements inside them, in a rolled-back transaction) and their times.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psutil

from harness import BenchDatabase, CpuMeter, Daemon, clone_jobs

IDLE_JOB = "SELECT radix.create_job('bench.idle0', jsonb_build_object('every', '6 hours'), %s, 'bench.tick')"
DUE_JOBS = """
SELECT count(radix.create_job('bench.due' || g, jsonb_build_object('every', '1 second'), %s, 'bench.tick'))
FROM generate_series(1, %s) g
"""
HOUR_NS = 3600 * 1_000_000_000
# Tables that grow with the jobs: a sequential scan of one of them costs time in proportion to the jobs
# defined (the one-row and near-empty tables, such as radix.attempt_secret, are scanned by design).
GROWING = ("jobs", "radix_system_job_state", "radix_system_job_history", "tick_locks", "attempt_frames")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=1_000_000, help="defined jobs in all (default 1000000)")
    parser.add_argument("--due-jobs", type=int, default=5, help="of them, jobs EVERY 1 second (default 5)")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="CPU measurement window (default 20)")
    parser.add_argument("--claims", type=int, default=50, help="claims and finds timed (default 50 each)")


def insert_jobs(db: BenchDatabase, args: argparse.Namespace) -> float:
    """Define the jobs; returns the seconds it took. Idle jobs' first ticks spread over 6 to 11 hours."""
    started = time.monotonic()
    with db.connect() as conn:
        conn.execute(IDLE_JOB.encode(), (db.principal,))
        clone_jobs(conn, "idle0", "idle", args.jobs - args.due_jobs - 1, vary=False, spread_ns=5 * HOUR_NS)
        conn.execute(DUE_JOBS.encode(), (db.principal, args.due_jobs))
        conn.execute(b"VACUUM ANALYZE radix.jobs, radix.radix_system_job_state")
    return time.monotonic() - started


def measure_daemon(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    daemon = Daemon(db.dsn, "bench-scale")
    try:
        time.sleep(5.0)  # start-up
        ran0 = int(db.scalar("SELECT count(*) FROM bench.ticks"))
        meter = CpuMeter(db, daemon.proc.pid)
        time.sleep(args.idle_seconds)
        cpu = meter.used()
        ran = int(db.scalar("SELECT count(*) FROM bench.ticks")) - ran0
        rss = psutil.Process(daemon.proc.pid).memory_info().rss
    finally:
        daemon.stop()
    return {"daemon_cpu_percent_of_a_core": round(100 * cpu["daemon"] / args.idle_seconds, 2),
            "server_cpu_percent_of_a_core": round(100 * cpu["server"] / args.idle_seconds, 2),
            "daemon_rss_mb": round(rss / 2**20, 1), "attempts_in_window": ran,
            "window_s": args.idle_seconds}


CLAIM = b"SELECT * FROM radix.claim_due('bench', 64)"
FIND = b"SELECT * FROM radix.find_ticks('bench', 64, 50, '{}', '{}')"


def explain(db: BenchDatabase, query: bytes) -> list[str]:
    """The plans of the statements ``query`` runs inside its function (auto_explain), rolled back."""
    plans: list[str] = []
    with db.connect() as conn:
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_analyze = on",
                        "log_buffers = on", "log_level = notice"):
            conn.execute(f"SET auto_explain.{setting}".encode())
        conn.execute(b"LOAD 'auto_explain'")
        conn.execute(b"SET auto_explain.log_min_duration = -1")
        conn.execute(b"BEGIN")
        conn.execute(query).fetchall()  # compiles the function
        conn.execute(b"ROLLBACK")
        conn.execute(b"SET auto_explain.log_min_duration = 0")
        conn.execute(b"BEGIN")
        conn.execute(query).fetchall()
        conn.execute(b"ROLLBACK")
    return [line for plan in plans for line in plan.splitlines() if line.strip()]


def time_query(db: BenchDatabase, query: bytes, count: int) -> list[float]:
    """Milliseconds of ``query``, each rolled back (client side)."""
    times = []
    with db.connect() as conn:
        conn.execute(b"BEGIN")
        conn.execute(query).fetchall()  # compiles the function
        conn.execute(b"ROLLBACK")
        for _ in range(count):
            conn.execute(b"BEGIN")
            started = time.perf_counter()
            conn.execute(query).fetchall()
            times.append((time.perf_counter() - started) * 1000)
            conn.execute(b"ROLLBACK")
            time.sleep(0.02)
    return times


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    insert_s = insert_jobs(db, args)
    daemon = measure_daemon(db, args)
    db.scalar("SELECT radix.register_node('bench', 'bench', 0)")
    time.sleep(1.1)  # the due jobs' next ticks are due (the daemon stopped)
    result: dict[str, Any] = {
        "jobs": int(db.scalar("SELECT count(*) FROM radix.jobs")), "due_every_second": args.due_jobs,
        "insert_s": round(insert_s, 1), **daemon}
    for name, query, index in (("claim", CLAIM, "radix_system_job_state_due"),
                               ("find", FIND, "radix_system_job_state_principal_due")):
        plan = explain(db, query)
        times = time_query(db, query, args.claims)
        scans = [line.strip() for line in plan if any(f"Seq Scan on {t} " in line for t in GROWING)]
        result |= {f"{name}_ms_median": round(statistics.median(times), 3), f"{name}_ms_max": round(max(times), 3),
                   f"{name}_uses_due_index": any(index in line for line in plan),
                   f"{name}_seq_scans": scans or "none", f"{name}_plan": plan}
    return {"scale": result}
