"""Throughput: N one-time jobs all due at once, each an atomic procedure updating one row; attempts/s.

One run measures the one-connection baseline, then the floor (scenarios/floor.py: the same unit of work sent
from this process on C connections as the principal, with none of radixjobs' own work; C is the most
connections the daemon uses for one principal, ``--max-per-principal``, by default half of ``--concurrency``):
the lone floor (one attempt per transaction) for the default burst and the batch floor (32 attempts per
transaction in savepoints, a full tick batch) for the batched one, each in its own copy of the scenario's
database (``--no-floor``: none). Then a burst of jobs with the default options (each attempt its own
transaction) and a burst of jobs ``WITH (batch = on)`` (tick batches: engine/batches.py), each in its own copy
of the scenario's database; each burst's rate is given as a ratio to the baseline and to its floor of the same
run, its CPU per attempt (scheduler and server) as a ratio to its floor's (client and server), and the batched
burst's rate as a ratio to the default one's (``--batch`` runs one burst only).

``--principals N`` and ``--procedures M`` spread the jobs over N LOGIN principals and M procedures (each
``bench.touch``'s one-row update): the jobs are dealt round-robin over the N × M (principal, procedure)
pairs, one template job per pair created through radix.create_job and cloned (harness.clone_jobs). Each burst
reports per principal when its last attempt finished, from the burst's first start, and the spread of those
times (min, median, max, max − min); the floors stay those of one principal on C connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from harness import GRANTS, BenchDatabase, CpuMeter, Daemon, clone_jobs, wait_for, with_dbname
from radixjobs.engine import Engine
from radixjobs.engine.batches import BATCH_MAX
from radixjobs.fairness import principal_cap
from scenarios import baseline, floor

# A one-time job due now, run as a principal (the caller, the superuser, names it), calling a procedure on one
# row of bench.counters.
CREATE_JOB = """
SELECT radix.create_job(%(job)s, jsonb_build_object('at', clock_timestamp()::text), %(principal)s, %(procedure)s,
                        jsonb_build_object('row_id', %(row_id)s::integer),
                        options => jsonb_build_object('batch', %(batch)s::bool))
"""
# The procedures of ``--procedures`` above one: each bench.touch's update.
PROCEDURE = ("CREATE PROCEDURE {}(row_id integer) LANGUAGE sql "
             "BEGIN ATOMIC UPDATE bench.counters SET n = n + 1 WHERE id = row_id; END")

SUMMARY = """
SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status <> 'succeeded'),
       count(*) FILTER (WHERE atomic), extract(epoch FROM max(finished_at) - min(started_at)),
       -- a tick's history row starts when its transaction did: the ticks of a batch share it (engine/batches.py)
       count(DISTINCT started_at) FILTER (WHERE status = 'succeeded')
FROM radix.radix_system_job_history
"""
# When each principal's last attempt finished, in seconds from the burst's first start.
LAST_FINISH = """
SELECT j.principal_name, extract(epoch FROM max(h.finished_at) - f.started)
FROM radix.radix_system_job_history h JOIN radix.jobs j USING (job_id),
     (SELECT min(started_at) AS started FROM radix.radix_system_job_history) f
GROUP BY j.principal_name, f.started ORDER BY j.principal_name
"""
# The bursts, in the order they run: the key in the result and whether the jobs are WITH (batch = on).
BURSTS = {"default": False, "batch_on": True}
# Each burst's floor: its name under result["floor"] and the attempts per transaction (a full tick batch).
FLOORS = {"default": ("lone", 1), "batch_on": ("batch", BATCH_MAX)}


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
                        help="serve --max-per-principal (default: the daemon's, half of --concurrency); also "
                             "the floors' connections")
    parser.add_argument("--principals", type=int, default=1, metavar="N",
                        help="LOGIN principals the jobs run as (default 1)")
    parser.add_argument("--procedures", type=int, default=1, metavar="M",
                        help="procedures the jobs call, each bench.touch's update (default 1); the jobs are "
                             "dealt round-robin over the N × M (principal, procedure) pairs")
    parser.add_argument("--no-floor", action="store_true",
                        help="measure no floor (no ratio_to_floor, no cpu_ratio_to_floor)")


def principal_connections(args: argparse.Namespace) -> int:
    """C: the most attempts (principal connections) the daemons run at once for one principal in the database."""
    slots: int = args.concurrency * (args.daemons if args.runner == "serve" else 1)
    cap = principal_cap(args.concurrency, args.max_per_principal)
    return min(cap, slots) if cap else slots


async def run_engine(dsn: str, concurrency: int, meter: CpuMeter | None = None,
                     max_per_principal: int | None = None) -> int:
    """Run everything due with an Engine in this process; the meter is read before its connections close."""
    async with Engine(dsn, node_id="bench-engine", concurrency=concurrency,
                      max_per_principal=max_per_principal) as engine:
        ran = await engine.run_due()
        if meter is not None:
            meter.stop()
        return ran


def run_jobs(db: BenchDatabase, args: argparse.Namespace) -> dict[str, float]:
    """Run every job; returns CPU seconds used meanwhile by the daemon (or this process) and the server."""
    if args.runner == "engine":
        meter = CpuMeter(db)
        started = time.process_time()
        asyncio.run(run_engine(db.dsn, args.concurrency, meter, args.max_per_principal))
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


def create_job(conn: psycopg.Connection[Any], principal: str, batch: bool, *, job: str = "bench.t0",
               procedure: str = "bench.touch", row_id: int = 0) -> None:
    """One job of CREATE_JOB, created by the superuser through radix.create_job, run as ``principal``."""
    conn.execute(CREATE_JOB.encode(), {"job": job, "principal": principal, "procedure": procedure,
                                       "row_id": row_id, "batch": batch})


@contextlib.contextmanager
def principals(db: BenchDatabase, count: int) -> Iterator[list[str]]:
    """The database's principal and ``count`` - 1 more LOGIN roles granted what it is (harness.GRANTS); the
    others are dropped afterwards (their grants first)."""
    others = [f"{db.principal}_{i}" for i in range(1, count)]
    try:
        with db.connect() as conn:
            for role in others:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
                for grant in GRANTS:
                    conn.execute(sql.SQL(grant).format(sql.Identifier(role)))
        yield [db.principal, *others]
    finally:
        with db.connect() as conn:
            for role in others:
                with contextlib.suppress(psycopg.errors.UndefinedObject):
                    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def procedures(db: BenchDatabase, count: int) -> list[str]:
    """bench.touch alone, or ``count`` procedures bench.touch_1 … bench.touch_COUNT made here."""
    if count == 1:
        return ["bench.touch"]
    names = [f"touch_{i}" for i in range(1, count + 1)]
    with db.connect() as conn:
        for name in names:
            conn.execute(sql.SQL(PROCEDURE).format(sql.Identifier("bench", name)))
    return [f"bench.{name}" for name in names]


def create_jobs(conn: psycopg.Connection[Any], jobs: int, batch: bool, pairs: list[tuple[str, str]]) -> None:
    """``jobs`` jobs dealt round-robin over the (principal, procedure) pairs: job i belongs to pair i mod P
    and updates row i. Per pair, one template job (row k for pair k) and its clones (rows k + P, k + 2P, …)."""
    for k, (principal, procedure) in enumerate(pairs):
        create_job(conn, principal, batch, job=f"bench.t{k}_0", procedure=procedure, row_id=k)
        clones = len(range(k, jobs, len(pairs))) - 1
        if clones:
            clone_jobs(conn, f"t{k}_0", f"t{k}_", clones, vary=True, first=k, stride=len(pairs), analyze=False)
    conn.execute(b"ANALYZE radix.jobs, radix.radix_system_job_state")


def measure_floor(db: BenchDatabase, args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """The floor of burst ``kind`` (FLOORS) in its own copy of the database: ``--jobs`` attempts on C
    connections as the database's principal."""
    name, per_transaction = FLOORS[kind]
    connections = principal_connections(args)
    with burst_database(db, f"floor_{name}") as copy:
        measured = floor.measure(copy, connections, args.jobs, per_transaction=per_transaction)
    return {"connections": connections, "per_transaction": per_transaction, **measured}


def fairness(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """When each principal's last attempt finished (seconds from the burst's first start), and their spread."""
    last = {str(name): float(seconds) for name, seconds in conn.execute(LAST_FINISH.encode()).fetchall()}
    times = list(last.values())
    return {"last_finish_s_by_principal": {name: round(seconds, 3) for name, seconds in last.items()},
            "last_finish_s_min": round(min(times), 3), "last_finish_s_median": round(statistics.median(times), 3),
            "last_finish_s_max": round(max(times), 3), "last_finish_spread_s": round(max(times) - min(times), 3)}


def burst(db: BenchDatabase, args: argparse.Namespace, batch: bool, one: float, pairs: list[tuple[str, str]],
          floor_of: dict[str, Any] | None) -> dict[str, Any]:
    """One burst of ``--jobs`` jobs (``batch``: WITH (batch = on)) run to the end, and its figures
    (``floor_of``: its floor, for the ratios to it)."""
    with db.connect() as conn:
        started = time.monotonic()
        create_jobs(conn, args.jobs, batch, pairs)
        create_s = time.monotonic() - started
    cpu = run_jobs(db, args)
    with db.connect() as conn:
        row = conn.execute(SUMMARY.encode()).fetchone()
        effects = conn.execute(b"SELECT count(*) FILTER (WHERE n = 1), sum(n) FROM bench.counters "
                               b"WHERE id >= 0").fetchone()
        spread = fairness(conn)
    assert row is not None
    assert effects is not None
    succeeded, other, atomic, span_s, transactions = row
    rate = succeeded / float(span_s)
    cpu_us = (cpu["daemon"] + cpu["server"]) / args.jobs * 1e6
    against_floor = {} if floor_of is None else {
        "ratio_to_floor": round(rate / floor_of["attempts_per_s"], 3),
        "cpu_ratio_to_floor": round(cpu_us / (floor_of["client_cpu_us_per_attempt"]
                                              + floor_of["server_cpu_us_per_attempt"]), 3)}
    return {"succeeded": succeeded, "not_succeeded": other, "atomic": atomic,
            "rows_updated_once": effects[0] == args.jobs and effects[1] == args.jobs,
            "seconds_first_start_to_last_finish": round(float(span_s), 3),
            "attempts_per_s": round(rate), "ratio_to_baseline": round(rate / one, 3), **against_floor,
            "ticks_per_transaction": round(succeeded / max(int(transactions), 1), 2),
            "scheduler_cpu_us_per_attempt": round(cpu["daemon"] / args.jobs * 1e6),
            "server_cpu_us_per_attempt": round(cpu["server"] / args.jobs * 1e6),
            "create_jobs_s": round(create_s, 1), "fairness": spread}


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    if min(args.principals, args.procedures) < 1 or args.jobs < args.principals * args.procedures:
        raise SystemExit("throughput: --principals and --procedures must be 1 or more, and --jobs at least "
                         "--principals × --procedures")
    one = baseline.measure(db, 1, args.baseline_seconds)
    with db.connect() as conn:
        conn.execute(b"INSERT INTO bench.counters (id) SELECT g FROM generate_series(0, %s) g", (args.jobs - 1,))
    kinds = {"both": list(BURSTS), "off": ["default"], "on": ["batch_on"]}[args.batch]
    if args.batch_first:
        kinds.reverse()
    floors = {} if args.no_floor else {kind: measure_floor(db, args, kind) for kind in kinds}
    result: dict[str, Any] = {"jobs": args.jobs, "runner": args.runner, "concurrency": args.concurrency,
                              "daemons": args.daemons if args.runner == "serve" else 0, "order": kinds,
                              "principals": args.principals, "procedures": args.procedures}
    with principals(db, args.principals) as roles:
        called = procedures(db, args.procedures)
        pairs = [(role, procedure) for role in roles for procedure in called]
        for kind in kinds:
            with burst_database(db, kind) as copy:
                result[kind] = burst(copy, args, BURSTS[kind], one, pairs, floors.get(kind))
    if len(kinds) == 2:
        result["batch_on_over_default"] = round(result["batch_on"]["attempts_per_s"]
                                                / result["default"]["attempts_per_s"], 3)
    if floors:
        result["floor"] = {FLOORS[kind][0]: {
            "connections": measured["connections"], "per_transaction": measured["per_transaction"],
            "attempts_per_s": round(measured["attempts_per_s"]),
            "ratio_to_baseline": round(measured["attempts_per_s"] / one, 3),
            "client_cpu_us_per_attempt": round(measured["client_cpu_us_per_attempt"]),
            "server_cpu_us_per_attempt": round(measured["server_cpu_us_per_attempt"])}
            for kind, measured in floors.items()}
    return {"throughput": result, "baseline": {"one_connection_commits_per_s": round(one)}}
