"""Tick cost: server CPU of one tick on one backend, with radix's bookkeeping and with it replaced by no-ops.

The daemon's tick query (engine/ticks.py: ``BEGIN; begin_tick; DO … CALL …; end_tick; COMMIT; <clean>``) is
sent ``--ticks`` times, one after another, on one connection logged in as the principal, and the CPU of that
backend alone is read (no other backend, no client, no concurrency). Rounds alternate two variants:

- ``radix``: radix.begin_tick and radix.end_tick as installed (the tick lock, the checks, the MAC, the frame,
  the state advanced, the history row, the prune);
- ``noop``: both replaced by functions that do nothing, in this scenario's own throwaway database (the same
  SECURITY DEFINER calls with the same settings, so what is left is the query itself: parsing, the CALL of
  ``bench.touch``, the commit, the clean).

The difference is radixjobs' own work in the server per tick; the rest is what any scheduler that runs the
procedure in its own transaction, as the principal, with the clean, pays. Each round reads CPU over
``--ticks`` ticks (the kernel counts in 10 ms steps: 2,000 ticks give about ±5 µs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psutil
import psycopg

from harness import BenchDatabase, clone_jobs
from radixjobs.engine.definitions import build_call
from radixjobs.engine.principals import principal_dsn
from radixjobs.engine.ticks import FIND_TICKS, Tick, tick_query

CREATE_JOB = """
SELECT radix.create_job('bench.t0', jsonb_build_object('at', clock_timestamp()::text), %s, 'bench.touch',
                        jsonb_build_object('row_id', 0))
"""
FUNCTIONS = ("radix.begin_tick(uuid, bigint, text)", "radix.end_tick(uuid, text, bigint, text)")
SIGNATURES = ("radix.begin_tick(job uuid, planned_ns bigint, mac text)",
              "radix.end_tick(job uuid, mac text, next_planned_ns bigint, node text)")
NOOP = """
CREATE OR REPLACE FUNCTION {signature} RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$ BEGIN END $$
"""
NODE = "bench-tickcost"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ticks", type=int, default=2_000, help="ticks per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each variant, alternated (default 3)")


def _backend_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _round(scheduler: psycopg.Connection[Any], principal: psycopg.Connection[Any], call: bytes, key: bytes,
           ticks: int) -> float:
    """Server CPU µs per tick over ``ticks`` ticks run one after another on ``principal``."""
    pid = principal.info.backend_pid
    done, started = 0, _backend_cpu_s(pid)
    while done < ticks:
        rows = scheduler.execute(FIND_TICKS.encode(), (NODE, 64, 0, [], [])).fetchall()
        if not rows:
            raise RuntimeError("no tick due: raise the number of jobs")
        now = time.monotonic()
        for row in rows[:ticks - done]:
            principal.execute(tick_query(call, Tick.from_row(row, now), 60_000, None, key, NODE.encode().hex()),
                              prepare=False)
            done += 1
    return (_backend_cpu_s(pid) - started) / ticks * 1e6


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    with db.connect() as conn:
        conn.execute(b"INSERT INTO bench.counters (id) VALUES (0)")
        conn.execute(CREATE_JOB.encode(), (db.principal,))
        clone_jobs(conn, "t0", "c", (args.ticks + 200) * args.rounds + 400, vary=False)
        arguments = db.scalar("SELECT arguments FROM radix.jobs WHERE job_name = 't0'")
        installed = [str(db.scalar("SELECT pg_get_functiondef(%s::regprocedure)", (f,))) for f in FUNCTIONS]
    call = build_call("bench", "touch", arguments)
    per_tick: dict[str, list[float]] = {"radix": [], "noop": []}
    with db.connect() as scheduler, psycopg.connect(principal_dsn(db.dsn, db.principal), autocommit=True,
                                                    prepare_threshold=None) as principal:
        scheduler.execute(b"SELECT radix.register_node(%s, 'localhost', 0)", (NODE,))
        session = principal.execute(b"SELECT radix.attempt_session()").fetchone()
        assert session is not None
        key = bytes.fromhex(session[0])
        _round(scheduler, principal, call, key, min(200, args.ticks))  # warm: plans cached, functions compiled
        for _ in range(args.rounds):
            for variant in per_tick:
                definitions = installed if variant == "radix" else [NOOP.format(signature=f) for f in SIGNATURES]
                for definition in definitions:
                    scheduler.execute(definition.encode())
                _round(scheduler, principal, call, key, min(200, args.ticks))  # the new definitions compiled
                per_tick[variant].append(_round(scheduler, principal, call, key, args.ticks))
    result: dict[str, Any] = {"ticks_per_round": args.ticks, "rounds": args.rounds}
    for variant, values in per_tick.items():
        result[f"{variant}_server_cpu_us_per_tick"] = round(statistics.median(values))
        result[f"{variant}_range"] = f"{min(values):.0f}-{max(values):.0f}"
    result["bookkeeping_us_per_tick"] = result["radix_server_cpu_us_per_tick"] - result["noop_server_cpu_us_per_tick"]
    return {"tickcost": result}
