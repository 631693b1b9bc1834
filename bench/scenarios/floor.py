"""Floor: an atomic attempt's query without radixjobs' own work, from one asyncio process.

``--jobs`` attempts of the throughput scenario's unit of work (``bench.touch``: one row updated), each sent the
way the daemon sends a tick (one simple query on a connection logged in as the principal: ``BEGIN; CALL …;
COMMIT;`` and the connection's clean, engine/principals.py), but with no ``radix.run_tick``, no finder, no
bookkeeping: psycopg async connections taking the next job from a queue
(``--connections``, repeatable: 4 and 8 by default, the default cap of one principal at 8 and at 16 slots per
database). What is left is psycopg, asyncio, libpq and the server running the procedure and committing: the
floor any Python scheduler with this isolation pays. Read
with ``throughput`` (same unit of work, same baseline), which measures its own floors in the same run through
``measure``: the gap between the two is radixjobs' own cost.

Two options measure designs radixjobs does not use (docs/hot-path.md, the levers): ``--per-query K`` sends K
attempts in one message, each still its own transaction followed by the clean (one round trip for K);
``--per-transaction K`` runs K attempts in one transaction, each in a savepoint, with one commit and one
clean (one round trip and one commit for K).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import psycopg

from harness import BenchDatabase, CpuMeter
from radixjobs.engine.principals import clean_statement, principal_dsn
from scenarios import baseline


def add_arguments(parser: argparse.ArgumentParser) -> None:
    baseline.add_arguments(parser)
    parser.add_argument("--jobs", type=int, default=10_000, help="attempts (default 10000)")
    parser.add_argument("--connections", type=int, action="append", default=None,
                        help="principal connections at once (repeatable; default 4 and 8)")
    parser.add_argument("--no-clean", action="store_true", help="leave the connection's clean out of each query")
    parser.add_argument("--per-query", type=int, default=1, metavar="K",
                        help="attempts per message, each its own transaction and clean (default 1)")
    parser.add_argument("--per-transaction", type=int, default=1, metavar="K",
                        help="attempts per transaction, each in a savepoint, one commit and clean (default 1)")


def _attempt(row_id: int) -> bytes:
    return f"CALL bench.touch({int(row_id)}); ".encode()


async def _worker(conn: psycopg.AsyncConnection[Any], queue: asyncio.Queue[int], clean: bool, per_query: int,
                  per_transaction: int) -> None:
    # the clean's statements after a COMMIT form an implicit transaction that a following BEGIN would join:
    # with more than one attempt per message each clean gets its own transaction block
    def cleaning() -> bytes:
        if not clean:
            return b""
        return b"BEGIN; " + clean_statement() + b"; COMMIT; " if per_query > 1 else clean_statement()

    while not queue.empty():
        parts: list[bytes] = []
        for _ in range(per_query):
            rows = [queue.get_nowait() for _ in range(min(per_transaction, queue.qsize()))]
            if not rows:
                break
            attempts = (_attempt(rows[0]) if per_transaction == 1
                        else b"".join(b"SAVEPOINT a; " + _attempt(r) + b"RELEASE a; " for r in rows))
            parts.append(b"BEGIN; " + attempts + b"COMMIT; " + cleaning())
        await conn.execute(b"".join(parts), prepare=False)


async def _measure(dsn: str, connections: int, jobs: int, clean: bool, per_query: int, per_transaction: int,
                   meter: CpuMeter) -> tuple[float, float]:
    """Seconds and this process's CPU seconds for ``jobs`` attempts over ``connections`` connections."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for row_id in range(jobs):
        queue.put_nowait(row_id)
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=None)
             for _ in range(connections)]
    try:
        meter.reset()
        started, cpu = time.monotonic(), time.process_time()
        await asyncio.gather(*(_worker(conn, queue, clean, per_query, per_transaction) for conn in conns))
        meter.stop()  # before the backends end, so their CPU is counted
        return time.monotonic() - started, time.process_time() - cpu
    finally:
        for conn in conns:
            await conn.close()


def measure(db: BenchDatabase, connections: int, jobs: int, *, clean: bool = True, per_query: int = 1,
            per_transaction: int = 1) -> dict[str, float]:
    """The floor of ``jobs`` attempts (rows 0 to ``jobs`` - 1 of bench.counters, which must exist) on
    ``connections`` connections logged in as the database's principal: attempts/s, and CPU µs per attempt of
    this process (the client) and of the server."""
    meter = CpuMeter(db)
    seconds, client_s = asyncio.run(_measure(principal_dsn(db.dsn, db.principal), connections, jobs, clean,
                                             per_query, per_transaction, meter))
    return {"attempts_per_s": jobs / seconds, "client_cpu_us_per_attempt": client_s / jobs * 1e6,
            "server_cpu_us_per_attempt": meter.used()["server"] / jobs * 1e6}


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    one = baseline.measure(db, 1, args.baseline_seconds)
    with db.connect() as conn:
        conn.execute(b"INSERT INTO bench.counters (id) SELECT g FROM generate_series(0, %s) g", (args.jobs - 1,))
    result: dict[str, Any] = {}
    for connections in args.connections or [4, 8]:
        floor = measure(db, connections, args.jobs, clean=not args.no_clean, per_query=args.per_query,
                        per_transaction=args.per_transaction)
        key = f"c{connections}"
        result |= {f"{key}_attempts_per_s": round(floor["attempts_per_s"]),
                   f"{key}_ratio_to_baseline": round(floor["attempts_per_s"] / one, 3),
                   f"{key}_client_cpu_us_per_attempt": round(floor["client_cpu_us_per_attempt"]),
                   f"{key}_server_cpu_us_per_attempt": round(floor["server_cpu_us_per_attempt"])}
    return {"floor": {"jobs": args.jobs, "clean": not args.no_clean, "per_query": args.per_query,
                      "per_transaction": args.per_transaction, **result},
            "baseline": {"one_connection_commits_per_s": round(one)}}
