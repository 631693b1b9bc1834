"""procrastinate as a peer of ``bench/run.py compare`` (protocol: bench/peers/__init__.py).

Configured as documented for a worker: ``App(PsycopgConnector)``, its schema applied with
``schema_manager.apply_schema_async``, one worker ``run_worker_async(concurrency=C)`` (LISTEN/NOTIFY on,
the defaults otherwise). The task bodies are async and use their own ``psycopg_pool.AsyncConnectionPool``
of C autocommit connections, as an application would.

- burst: N jobs of task ``touch`` deferred with one ``batch_defer_async`` before ``go`` (not measured);
  ``go`` starts the worker.
- ticks: N periodic tasks ``cron="* * * * * *"`` (every second; cron cannot express a sub-second offset, so
  procrastinate's ticks are always aligned), told apart by ``periodic_id`` and a ``job`` argument; the
  worker (with its periodic deferrer) starts before ``ready``. Each job receives its planned tick as
  ``timestamp``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import procrastinate
from procrastinate.types import JSONDict
from psycopg_pool import AsyncConnectionPool

from peers import INSERT_TICK, UPDATE_TOUCHED, hear, peer_arguments, say


async def main() -> None:
    args = peer_arguments(__doc__.splitlines()[0]).parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)  # "App in the main module": a script
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=args.dsn, min_size=2, max_size=args.concurrency + 4))
    pool = AsyncConnectionPool(args.dsn, min_size=args.concurrency, max_size=args.concurrency,
                               kwargs={"autocommit": True}, open=False)

    @app.task(name="touch")
    async def touch(row_id: int) -> None:
        async with pool.connection() as conn:
            await conn.execute(UPDATE_TOUCHED, (row_id,))

    async def tick(timestamp: int, job: int) -> None:
        started = time.time()
        async with pool.connection() as conn:
            await conn.execute(INSERT_TICK, ("procrastinate", job, timestamp, started))

    if args.workload == "ticks":
        task = app.task(name="tick")(tick)
        for job in range(args.jobs):
            app.periodic(cron="* * * * * *", periodic_id=str(job), task_kwargs={"job": job})(task)

    loop = asyncio.get_running_loop()
    async with app.open_async():
        await pool.open(wait=True)
        async with pool.connection() as conn:  # a database of an earlier repetition has the schema
            row = await (await conn.execute(b"SELECT to_regclass('procrastinate_jobs') IS NOT NULL")).fetchone()
            if row is not None and row[0]:
                await conn.execute(b"TRUNCATE procrastinate_jobs CASCADE")
        if row is None or not row[0]:
            await app.schema_manager.apply_schema_async()
        worker: asyncio.Task[None] | None = None

        def start_worker() -> asyncio.Task[None]:
            return asyncio.create_task(app.run_worker_async(concurrency=args.concurrency, wait=True,
                                                            install_signal_handlers=False))

        if args.workload == "burst":
            rows: list[JSONDict] = [{"row_id": row} for row in range(args.jobs)]
            await touch.batch_defer_async(*rows)
            say("ready")
            await loop.run_in_executor(None, hear, "go")
            worker = start_worker()
        else:
            worker = start_worker()
            say("ready")
            await loop.run_in_executor(None, hear, "go")
        await loop.run_in_executor(None, hear, "stop")
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        await pool.close()
    say("stopped")


if __name__ == "__main__":
    asyncio.run(main())
