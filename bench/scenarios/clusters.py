"""Clusters: one daemon serving 1 or 2 clusters (``serve --dsn A --dsn B``), N one-time jobs per cluster all
due at once (the throughput scenario's atomic one-row procedure); attempts/s over every cluster.

The second cluster is a second embedded server in its own temporary home (or ``--second-dsn``, a superuser
DSN of another server). With ``--clusters 2`` each cluster gets ``--per-database-concurrency`` slots, so
the node runs twice the attempts at once; ``--same-slots`` keeps the node's total at one cluster's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from typing import Any

from harness import BenchDatabase, CpuMeter, Daemon, bench_database, clone_jobs, wait_for
from scenarios import baseline
from scenarios.throughput import create_job

SPAN = """
SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status <> 'succeeded'),
       extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at))
FROM radix.radix_system_job_history
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    baseline.add_arguments(parser)
    parser.add_argument("--jobs", type=int, default=5_000, help="one-time jobs per cluster (default 5000)")
    parser.add_argument("--clusters", type=int, choices=(1, 2), default=2, help="clusters served (default 2)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="attempts at once per cluster (its one database; default 8)")
    parser.add_argument("--same-slots", action="store_true",
                        help="with 2 clusters, the node's --concurrency stays that of one cluster")
    parser.add_argument("--second-dsn", default=None, help="superuser DSN of the second cluster's server")


def prepare(db: BenchDatabase, jobs: int) -> None:
    """``jobs`` one-time jobs, held back (due_ns NULL) until every cluster is ready."""
    with db.connect() as conn:
        conn.execute(b"INSERT INTO bench.counters (id) SELECT g FROM generate_series(0, %s) g", (jobs - 1,))
        create_job(conn, db.principal, False)  # the default options: no tick batches
        clone_jobs(conn, "t0", "t", jobs - 1, vary=True)
        conn.execute(b"UPDATE radix.radix_system_job_state SET due_ns = NULL")


def finished(db: BenchDatabase, jobs: int) -> bool:
    return bool(db.scalar("SELECT count(*) = %s FROM radix.radix_system_job_history WHERE finished_at IS NOT NULL",
                          (jobs,)))


def measure(dbs: list[BenchDatabase], args: argparse.Namespace) -> dict[str, Any]:
    for db in dbs:
        prepare(db, args.jobs)
    per_cluster = args.concurrency
    node = per_cluster * (1 if args.same_slots else len(dbs))
    extra = [arg for db in dbs[1:] for arg in ("--dsn", db.dsn)]
    daemon = Daemon(dbs[0].dsn, "bench-clusters", *extra, "--concurrency", str(node), "--per-cluster-concurrency",
                    str(node // len(dbs)), "--per-database-concurrency", str(node // len(dbs)))
    try:
        meters = [CpuMeter(db, daemon.proc.pid if index == 0 else None) for index, db in enumerate(dbs)]
        for db in dbs:
            with db.connect() as conn:
                conn.execute(b"UPDATE radix.radix_system_job_state SET due_ns = planned_ns")
                conn.execute(b"NOTIFY radix_jobs")
        for db in dbs:
            wait_for(functools.partial(finished, db, args.jobs), timeout=900, interval=0.25,
                     message="every attempt to finish")
        used = [meter.used() for meter in meters]
    finally:
        daemon.stop()
    spans = []
    for db in dbs:
        with db.connect() as conn:
            row = conn.execute(SPAN.encode()).fetchone()
        assert row is not None
        spans.append(row)
    succeeded = sum(int(row[0]) for row in spans)
    first, last = min(float(row[2]) for row in spans), max(float(row[3]) for row in spans)
    total = args.jobs * len(dbs)
    return {"clusters": len(dbs), "jobs_per_cluster": args.jobs, "node_concurrency": node,
            "per_cluster_concurrency": node // len(dbs), "succeeded": succeeded,
            "not_succeeded": sum(int(row[1]) for row in spans),
            "seconds_first_start_to_last_finish": round(last - first, 3),
            "attempts_per_s": round(succeeded / (last - first)),
            "per_cluster_attempts_per_s": [round(int(row[0]) / (float(row[3]) - float(row[2]))) for row in spans],
            "scheduler_cpu_us_per_attempt": round(used[0]["daemon"] / total * 1e6),
            "servers_cpu_us_per_attempt": round(sum(u["server"] for u in used) / total * 1e6)}


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    one = baseline.measure(db, 1, args.baseline_seconds)  # the first cluster's server, this run: for ratios
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        dbs = [db]
        if args.clusters == 2:
            dbs.append(stack.enter_context(bench_database("clusters2", args.second_dsn, db.settings, args.pg_bin)))
        result = measure(dbs, args)
    result["ratio_to_baseline"] = round(result["attempts_per_s"] / one, 3)
    return {"clusters": result, "baseline": {"one_connection_commits_per_s": round(one)},
            "wall_s": round(time.monotonic() - started, 1)}
