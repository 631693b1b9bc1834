"""Tick cost: server CPU of one tick on one backend, with radix's bookkeeping, with it replaced by no-ops, and
without the connection's clean.

The daemon's tick query (engine/ticks.py: ``BEGIN; <timeout>; SELECT … FROM radix.run_tick(…); COMMIT; <clean>``) is
sent ``--ticks`` times, one after another, on one connection logged in as the principal, and the CPU of that
backend alone is read (no other backend, no client, no concurrency). Rounds alternate three variants:

- ``radix``: the query as the daemon sends it, radix.start_tick and radix.end_tick (radix.start_ticks and
  radix.end_ticks for a batch) as installed (the tick lock, the checks, the MAC, the frame, the state
  advanced, the history row, the prune);
- ``noop``: those functions replaced by functions that do nothing, in this scenario's own throwaway database
  (the same SECURITY DEFINER calls with the same settings, so what is left is the query itself: parsing, the
  CALL of ``bench.touch``, the commit, the clean);
- ``noclean``: as ``radix``, with the clean after the COMMIT (engine/principals.py) replaced by
  ``SELECT true``: what the clean's twelve statements cost per tick.

``radix − noop`` is radixjobs' own work in the server per tick; the rest is what any scheduler that runs the
procedure in its own transaction, as the principal, pays. ``--history N`` first gives every job N rows of
history (then VACUUM ANALYZE), as a recurring job has once it has run N times: at or past its limit (256 by
default) every tick also prunes its oldest row. ``--batch K`` sends K ticks per transaction, as the daemon's
tick batches do (``BEGIN; SELECT … FROM radix.run_ticks(…); COMMIT; <clean>``, engine/batches.py), of jobs
``WITH (batch = on)``. The
jobs are one-time jobs, each run once; ``--recurring`` runs 500 jobs EVERY 1 hour instead, each many times,
made due again when none is (every job runs once before the rounds: a job's later ticks, as in a daemon that
has run for a while). ``--perf FILE`` runs one more
``radix`` round, not counted, under ``perf record`` attached to the backend (perf must be installed; DWARF
call graphs, as the server is built without frame pointers, so ``perf report --children`` gives each C
function with what it calls). Each round reads CPU over ``--ticks`` ticks (the kernel counts in 10 ms steps:
2,000 ticks give about ±5 µs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import time
import uuid
from typing import Any

import psutil
import psycopg

from harness import BenchDatabase, clone_jobs, wait_for
from radixjobs.engine.attempt import TICK_ROW
from radixjobs.engine.batches import BatchItem, batch_query
from radixjobs.engine.definitions import ARGUMENTS, JobDefinition, build_call, build_tick_call
from radixjobs.engine.principals import principal_dsn
from radixjobs.engine.ticks import FIND_TICKS, Tick, tick_query
from radixjobs.model import AtSchedule

# WITH (batch = on) when the ticks run in batches (--batch K): radix.start_ticks starts no other job's tick
CREATE_JOB = """
SELECT radix.create_job('bench.t0', jsonb_build_object('at', clock_timestamp()::text), %s, 'bench.touch',
                        jsonb_build_object('row_id', 0), options => jsonb_build_object('batch', %s::bool))
"""
CREATE_RECURRING = """
SELECT radix.create_job('bench.t0', jsonb_build_object('every', '1 hour'), %s, 'bench.touch',
                        jsonb_build_object('row_id', 0), options => jsonb_build_object('batch', %s::bool))
"""
# --recurring: every job due again, its planned tick kept (the tests' controllable clock)
DUE_AGAIN = "UPDATE radix.radix_system_job_state SET due_ns = radix.to_ns(clock_timestamp())"
RECURRING_JOBS = 500
HOUR_NS = 3600 * 10**9
# Rows a job has after N runs; planned_ns below zero, apart from every tick this scenario runs.
HISTORY = """
INSERT INTO radix.radix_system_job_history (job_id, definition_version, planned_ns, attempt, idempotency_key,
                                            status, node, run_kind, atomic, started_at, finished_at)
SELECT j.job_id, j.definition_version, -g, 1, j.job_id::text || '/' || (-g)::text, 'succeeded', 'bench', 'schedule',
       true, now(), now()
FROM radix.jobs j, generate_series(1, %s) g
"""
FUNCTIONS = ("radix.start_tick(uuid, bigint, text)", "radix.end_tick(uuid, bigint, integer, text, bigint, text)",
             "radix.start_ticks(uuid[], bigint[], text[])",
             "radix.end_ticks(uuid[], bigint[], integer[], text[], bigint[], boolean[], text)")
SIGNATURES = ("radix.start_tick(job uuid, planned_ns bigint, mac text, OUT error_sqlstate text, "
              "OUT error_message text, OUT frame text, OUT arguments jsonb)",
              "radix.end_tick(job uuid, planned bigint, attempt integer, mac text, next_ns bigint, node text) "
              "RETURNS void",
              "radix.start_ticks(jobs uuid[], planned bigint[], macs text[]) RETURNS TABLE (ordinal integer, "
              "error_sqlstate text, error_message text, frame text, arguments jsonb)",
              "radix.end_ticks(jobs uuid[], planned bigint[], attempts integer[], macs text[], nexts bigint[], "
              "ran boolean[], node text) RETURNS void")
NOOP = """
CREATE OR REPLACE FUNCTION {signature}
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$ BEGIN {body} END $$
"""
# A no-op start_tick still gives the CALL the arguments every job of this scenario has.
NOOP_BODIES = {SIGNATURES[0]: "arguments := '[{\"value\": \"0\"}]';"}
NODE = "bench-tickcost"
VARIANTS = ("radix", "noop", "noclean")
WARM = 200  # ticks run, not counted, after the functions change: plans cached, functions compiled


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ticks", type=int, default=2_000, help="ticks per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each variant, alternated (default 3)")
    parser.add_argument("--history", type=int, default=0, metavar="N",
                        help="history rows each job has before it runs (default 0; 256 is a recurring job "
                             "at its default limit)")
    parser.add_argument("--recurring", action="store_true",
                        help=f"{RECURRING_JOBS} jobs EVERY 1 hour, each run many times (made due again when none "
                             "is), instead of one-time jobs run once each")
    parser.add_argument("--batch", type=int, default=1, metavar="K",
                        help="ticks per transaction, as the daemon's tick batches send them (radix.run_ticks; "
                             "default 1: lone ticks)")
    parser.add_argument("--perf", metavar="FILE", default=None,
                        help="one more radix round under `perf record` on the backend, written to FILE")


def _backend_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _round(scheduler: psycopg.Connection[Any], principal: psycopg.Connection[Any], job: JobDefinition, key: bytes,
           ticks: int, clean: bool = True, recurring: bool = False, batch: int = 1) -> float:
    """Server CPU µs per tick over ``ticks`` ticks run one after another on ``principal``, ``batch`` ticks
    per transaction."""
    pid = principal.info.backend_pid
    done, started = 0, _backend_cpu_s(pid)
    while done < ticks:
        rows = scheduler.execute(FIND_TICKS.encode(), (NODE, 64, 0, [], [], [])).fetchall()
        if not rows and recurring:
            scheduler.execute(DUE_AGAIN.encode())
            continue
        if not rows:
            raise RuntimeError("no tick due: raise the number of jobs")
        now = time.monotonic()
        found = [Tick.from_row(row, now) for row in rows[:ticks - done]]
        for first in range(0, len(found), batch):
            chunk = found[first:first + batch]
            items = [BatchItem(job, tick, tick.planned_ns + HOUR_NS if recurring else None) for tick in chunk]
            if batch > 1:
                query = batch_query(items, key, NODE.encode().hex())
            else:
                query = tick_query(job.tick_call_constant, chunk[0], 60_000, items[0].next_planned_ns, key,
                                   NODE.encode().hex())
            if not clean:
                query = query[:query.index(b"COMMIT; ") + len(b"COMMIT; ")] + b"SELECT true"
            if batch > 1:
                with principal.cursor() as cursor:
                    cursor.execute(query, prepare=False)
                    for _ in range(TICK_ROW):
                        cursor.nextset()
                    outcomes = cursor.fetchall()
                    if len(outcomes) != len(chunk) or any(row[0] is not None for row in outcomes):
                        raise RuntimeError(f"a tick of the batch failed: {outcomes}")
            else:
                principal.execute(query, prepare=False)
            done += len(chunk)
    return (_backend_cpu_s(pid) - started) / ticks * 1e6


def _perf_round(scheduler: psycopg.Connection[Any], principal: psycopg.Connection[Any], job: JobDefinition,
                key: bytes, ticks: int, output: str, recurring: bool, batch: int) -> None:
    """One radix round under perf record, attached to the principal's backend."""
    perf = shutil.which("perf")
    if perf is None:
        raise RuntimeError("--perf: perf is not installed")
    _round(scheduler, principal, job, key, WARM, recurring=recurring, batch=batch)
    if os.path.exists(output):
        os.remove(output)  # perf would keep it as FILE.old
    recorder = subprocess.Popen([perf, "record", "--call-graph", "dwarf,16384", "-e", "cpu-clock", "-F", "2000",
                                 "-o", output, "-p", str(principal.info.backend_pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # perf says nothing when it is ready; its output file appears once it has attached
    wait_for(lambda: recorder.poll() is not None or os.path.exists(output), 10, "perf to attach")
    try:
        _round(scheduler, principal, job, key, ticks, recurring=recurring, batch=batch)
    finally:
        recorder.send_signal(signal.SIGINT)
        _, err = recorder.communicate(timeout=60)
    if recorder.returncode not in (0, -signal.SIGINT):
        raise RuntimeError(f"perf record failed: {err.decode(errors='replace').strip()}")


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    # noop rounds advance no state: only the radix and noclean rounds (and the warm-ups) use up one-time jobs
    consumed = (args.ticks + WARM) * (2 * args.rounds + (1 if args.perf else 0)) + WARM
    jobs = RECURRING_JOBS if args.recurring else consumed + 400
    with db.connect() as conn:
        conn.execute(b"INSERT INTO bench.counters (id) VALUES (0)")
        conn.execute((CREATE_RECURRING if args.recurring else CREATE_JOB).encode(), (db.principal, args.batch > 1))
        clone_jobs(conn, "t0", "c", jobs - 1, vary=False)
        if args.history > 0:
            conn.execute(HISTORY.encode(), (args.history,))
            conn.execute(b"VACUUM ANALYZE radix.radix_system_job_history")
        arguments = db.scalar("SELECT arguments FROM radix.jobs WHERE job_name = 't0'")
        installed = [str(db.scalar("SELECT pg_get_functiondef(%s::regprocedure)", (f,))) for f in FUNCTIONS]
    job = JobDefinition(uuid.UUID(int=0), 1, "bench.t0", "", "", build_call("bench", "touch", arguments, ARGUMENTS),
                        60_000, False, AtSchedule(0), tick_call=build_tick_call("bench", "touch", arguments))
    per_tick: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    with db.connect() as scheduler, psycopg.connect(principal_dsn(db.dsn, db.principal), autocommit=True,
                                                    prepare_threshold=None) as principal:
        scheduler.execute(b"SELECT radix.register_node(%s, 'localhost', 0)", (NODE,))
        session = principal.execute(b"SELECT radix.attempt_session()").fetchone()
        assert session is not None
        key = bytes.fromhex(session[0])
        # warm: plans cached, functions compiled, and (recurring) every job run once, as it is once it has run
        _round(scheduler, principal, job, key, jobs if args.recurring else min(WARM, args.ticks),
               recurring=args.recurring, batch=args.batch)
        for _ in range(args.rounds):
            for variant in VARIANTS:
                definitions = ([NOOP.format(signature=f, body=NOOP_BODIES.get(f, "")) for f in SIGNATURES]
                               if variant == "noop" else installed)
                for definition in definitions:
                    scheduler.execute(definition.encode())
                clean = variant != "noclean"
                _round(scheduler, principal, job, key, min(WARM, args.ticks), clean, args.recurring, args.batch)
                per_tick[variant].append(_round(scheduler, principal, job, key, args.ticks, clean, args.recurring,
                                                args.batch))
        if args.perf:
            for definition in installed:
                scheduler.execute(definition.encode())
            _perf_round(scheduler, principal, job, key, args.ticks, args.perf, args.recurring, args.batch)
    result: dict[str, Any] = {"ticks_per_round": args.ticks, "ticks_per_transaction": args.batch,
                              "rounds": args.rounds, "history_rows": args.history,
                              "jobs": "recurring" if args.recurring else "one-time"}
    for variant, values in per_tick.items():
        result[f"{variant}_server_cpu_us_per_tick"] = round(statistics.median(values))
        result[f"{variant}_range"] = f"{min(values):.0f}-{max(values):.0f}"
    result["bookkeeping_us_per_tick"] = result["radix_server_cpu_us_per_tick"] - result["noop_server_cpu_us_per_tick"]
    result["clean_us_per_tick"] = result["radix_server_cpu_us_per_tick"] - result["noclean_server_cpu_us_per_tick"]
    if args.perf:
        result["perf_data"] = args.perf
    return {"tickcost": result}
