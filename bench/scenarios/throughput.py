"""Throughput: N one-time jobs all due at once, each an atomic procedure updating one row; attempts/s.

One run measures the one-connection baseline, then a burst of jobs with the default options (each attempt its
own transaction) and a burst of jobs ``WITH (batch = on)`` (tick batches: engine/batches.py), each in its own
copy of the scenario's database; each burst's rate is given as a ratio to the baseline of the same run, and
the batched burst's as a ratio to the default one's (``--batch`` runs one burst only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from harness import BenchDatabase, CpuMeter, Daemon, clone_jobs, wait_for, with_dbname
from radixjobs.engine import Engine
from scenarios import baseline

CREATE_JOB = """
SELECT radix.create_job('bench.t0', jsonb_build_object('at', clock_timestamp()::text), %s, 'bench.touch',
                        jsonb_build_object('row_id', 0), options => jsonb_build_object('batch', %s::bool))
"""

SUMMARY = """
SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status <> 'succeeded'),
       count(*) FILTER (WHERE atomic), extract(epoch FROM max(finished_at) - min(started_at)),
       -- a tick's history row starts when its transaction did: the ticks of a batch share it (engine/batches.py)
       count(DISTINCT started_at) FILTER (WHERE status = 'succeeded')
FROM radix.radix_system_job_history
"""
# The bursts, in the order they run: the key in the result and whether the jobs are WITH (batch = on).
BURSTS = {"default": False, "batch_on": True}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    baseline.add_arguments(parser)
    parser.add_argument("--jobs", type=int, default=10_000, help="one-time jobs per burst (default 10000)")
    parser.add_argument("--batch", choices=("both", "off", "on"), default="both",
                        help="bursts of jobs with the default options (off), WITH (batch = on) (on), or one of "
                             "each, in that order (both, the default)")
    parser.add_argument("--batch-first", action="store_true", help="with --batch both: the batch = on burst first")
    parser.add_argument("--runner", choices=("serve", "engine"), default="serve",
                        help="radixjobs serve in a subprocess (default), or an Engine in this process")
    parser.add_argument("--concurrency", type=int, default=16, help="attempts at once (the daemon's default 16)")
    parser.add_argument("--daemons", type=int, default=1, help="radixjobs serve processes (default 1)")
    parser.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="serve --event-loop (default asyncio)")
    parser.add_argument("--max-per-principal", type=int, default=None,
                        help="serve --max-per-principal (default: the daemon's, half of --concurrency)")


async def run_engine(dsn: str, concurrency: int, meter: CpuMeter | None = None) -> int:
    """Run everything due with an Engine in this process; the meter is read before its connections close."""
    async with Engine(dsn, node_id="bench-engine", concurrency=concurrency) as engine:
        ran = await engine.run_due()
        if meter is not None:
            meter.stop()
        return ran


def run_jobs(db: BenchDatabase, args: argparse.Namespace) -> dict[str, float]:
    """Run every job; returns CPU seconds used meanwhile by the daemon (or this process) and the server."""
    if args.runner == "engine":
        meter = CpuMeter(db)
        started = time.process_time()
        asyncio.run(run_engine(db.dsn, args.concurrency, meter))
        return meter.used() | {"daemon": time.process_time() - started}
    with db.connect() as conn:  # held back until every daemon is up, then all due at once
        conn.execute(b"UPDATE radix.radix_system_job_state SET due_ns = NULL")
    daemons = [Daemon(db.dsn, f"bench-serve-{i}", "--per-database-concurrency", str(args.concurrency),
                      "--concurrency", str(max(32, args.concurrency)), "--event-loop", args.event_loop,
                      *(["--max-per-principal", str(args.max_per_principal)] if args.max_per_principal else []))
               for i in range(args.daemons)]
    try:
        meters = [CpuMeter(db, daemon.proc.pid) for daemon in daemons]
        with db.connect() as conn:
            conn.execute(b"UPDATE radix.radix_system_job_state SET due_ns = planned_ns")
            conn.execute(b"NOTIFY radix_jobs")
        wait_for(lambda: db.scalar("SELECT count(*) = %s FROM radix.radix_system_job_history "
                                   "WHERE finished_at IS NOT NULL", (args.jobs,)),
                 timeout=600, interval=0.25, message="every attempt to finish")
        used = [meter.used() for meter in meters]
        return {"daemon": sum(u["daemon"] for u in used), "server": used[0]["server"]}
    finally:
        for daemon in daemons:
            daemon.stop()


@contextlib.contextmanager
def burst_database(db: BenchDatabase, kind: str) -> Iterator[BenchDatabase]:
    """A copy of the scenario's database (its schema, principal grants and counters, no job yet) for one
    burst, dropped afterwards: each burst starts from the same state (a history emptied and analyzed between
    two bursts in one database left generic plans of the second one's sessions expecting an empty table), and
    after a checkpoint (none of the previous burst's writes left to a checkpoint during this one)."""
    name = f"{conninfo_to_dict(db.dsn)['dbname']}_{kind}"
    with psycopg.connect(db.admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(str(conninfo_to_dict(db.dsn)["dbname"]))))
        admin.execute(b"CHECKPOINT")
    try:
        yield dataclasses.replace(db, dsn=with_dbname(db.dsn, name))
    finally:
        with psycopg.connect(db.admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def burst(db: BenchDatabase, args: argparse.Namespace, batch: bool, one: float) -> dict[str, Any]:
    """One burst of ``--jobs`` jobs (``batch``: WITH (batch = on)) run to the end, and its figures."""
    with db.connect() as conn:
        started = time.monotonic()
        conn.execute(CREATE_JOB.encode(), (db.principal, batch))
        clone_jobs(conn, "t0", "t", args.jobs - 1, vary=True)
        create_s = time.monotonic() - started
    cpu = run_jobs(db, args)
    with db.connect() as conn:
        row = conn.execute(SUMMARY.encode()).fetchone()
        effects = conn.execute(b"SELECT count(*) FILTER (WHERE n = 1), sum(n) FROM bench.counters "
                               b"WHERE id >= 0").fetchone()
    assert row is not None
    assert effects is not None
    succeeded, other, atomic, span_s, transactions = row
    rate = succeeded / float(span_s)
    return {"succeeded": succeeded, "not_succeeded": other, "atomic": atomic,
            "rows_updated_once": effects[0] == args.jobs and effects[1] == args.jobs,
            "seconds_first_start_to_last_finish": round(float(span_s), 3),
            "attempts_per_s": round(rate), "ratio_to_baseline": round(rate / one, 3),
            "ticks_per_transaction": round(succeeded / max(int(transactions), 1), 2),
            "scheduler_cpu_us_per_attempt": round(cpu["daemon"] / args.jobs * 1e6),
            "server_cpu_us_per_attempt": round(cpu["server"] / args.jobs * 1e6),
            "create_jobs_s": round(create_s, 1)}


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    one = baseline.measure(db, 1, args.baseline_seconds)
    with db.connect() as conn:
        conn.execute(b"INSERT INTO bench.counters (id) SELECT g FROM generate_series(0, %s) g", (args.jobs - 1,))
    kinds = {"both": list(BURSTS), "off": ["default"], "on": ["batch_on"]}[args.batch]
    if args.batch_first:
        kinds.reverse()
    result: dict[str, Any] = {"jobs": args.jobs, "runner": args.runner, "concurrency": args.concurrency,
                              "daemons": args.daemons if args.runner == "serve" else 0, "order": kinds}
    for kind in kinds:
        with burst_database(db, kind) as copy:
            result[kind] = burst(copy, args, BURSTS[kind], one)
    if len(kinds) == 2:
        result["batch_on_over_default"] = round(result["batch_on"]["attempts_per_s"]
                                                / result["default"]["attempts_per_s"], 3)
    return {"throughput": result, "baseline": {"one_connection_commits_per_s": round(one)}}
