"""Baseline: single-row UPDATE commits per second from one connection, and from two processes at once.

Every other figure is reported as a ratio to this, measured in the same run on the same server.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import psycopg

from harness import BenchDatabase, CpuMeter

UPDATE = b"UPDATE bench.counters SET n = n + 1 WHERE id = %s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline-seconds", type=float, default=5.0, help="seconds per baseline measurement")


def commit_loop(dsn: str, row_id: int, start_at: float, seconds: float, meter: CpuMeter | None = None) -> int:
    """Commit single-row UPDATEs (autocommit) from ``start_at`` for ``seconds``; returns how many. The
    meter, if any, is reset at the start and read before the connection (its backend) ends."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(b"INSERT INTO bench.counters (id) VALUES (%s) ON CONFLICT DO NOTHING", (row_id,))
        time.sleep(max(0.0, start_at - time.time()))
        if meter is not None:
            meter.reset()
        end = time.monotonic() + seconds
        commits = 0
        while time.monotonic() < end:
            conn.execute(UPDATE, (row_id,))
            commits += 1
        if meter is not None:
            meter.stop()
    return commits


def measure(db: BenchDatabase, connections: int, seconds: float) -> float:
    """Commits per second of ``connections`` client processes, each with its own connection and row."""
    start_at = time.time() + 1.0
    if connections == 1:
        return commit_loop(db.dsn, -1, start_at, seconds) / seconds
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(connections, mp_context=context) as pool:
        futures = [pool.submit(commit_loop, db.dsn, -1 - i, start_at, seconds) for i in range(connections)]
        return sum(f.result() for f in futures) / seconds


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    meter = CpuMeter(db)
    commits = commit_loop(db.dsn, -1, time.time(), args.baseline_seconds, meter)
    server_s = meter.used()["server"]
    one = measure(db, 1, args.baseline_seconds)
    two = measure(db, 2, args.baseline_seconds)
    return {"baseline": {"one_connection_commits_per_s": round(one), "two_connections_commits_per_s": round(two),
                         "two_to_one": round(two / one, 2), "seconds": args.baseline_seconds,
                         "server_cpu_us_per_commit": round(server_s / commits * 1e6),
                         "server_settings": db.settings or "as given by --dsn"}}
