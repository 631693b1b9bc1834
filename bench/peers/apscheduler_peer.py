"""APScheduler 3.x as a peer of ``bench/run.py compare`` (protocol: bench/peers/__init__.py).

Configured as its user guide shows for a persistent job store: ``BackgroundScheduler`` with one
``SQLAlchemyJobStore`` on the same PostgreSQL through psycopg 3 (``postgresql+psycopg://``), a
``ThreadPoolExecutor(C)``, job defaults ``misfire_grace_time=None`` (a late job still runs) and otherwise
the defaults (``coalesce=True``: missed runs of a job collapse into one, ``max_instances=1``). The job
bodies are plain functions using a ``psycopg_pool.ConnectionPool`` of C autocommit connections.

- burst: the scheduler is started paused, N ``date`` jobs due now are added (each an INSERT into the
  store; not measured), and ``go`` resumes it.
- ticks: N ``interval`` jobs of 1 second whose first run is ``--anchor`` + the job's offset; the scheduler
  runs from before ``ready``. The body takes its start time first, updates its row of ``bench.touched``
  and returns the start time; a listener of ``EVENT_JOB_EXECUTED`` pairs it with the event's
  ``scheduled_run_time`` (APScheduler 3 does not hand a job its planned time), and the pairs are written
  to ``bench.peer_ticks`` after ``stop``.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apscheduler.events import EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool
from sqlalchemy import URL

from peers import INSERT_TICK, UPDATE_TOUCHED, hear, peer_arguments, say, tick_offset

POOL: ConnectionPool[Any] | None = None


def touch(row_id: int) -> None:
    assert POOL is not None
    with POOL.connection() as conn:
        conn.execute(UPDATE_TOUCHED, (row_id,))


def tick(job: int) -> float:
    started = time.time()
    assert POOL is not None
    with POOL.connection() as conn:
        conn.execute(UPDATE_TOUCHED, (job,))
    return started


RUNS: list[tuple[int, float, float]] = []  # (job, planned, started) of every tick run


def record(event: JobExecutionEvent) -> None:
    if event.job_id.startswith("tick-"):
        RUNS.append((int(event.job_id.removeprefix("tick-")), event.scheduled_run_time.timestamp(), event.retval))


def sqlalchemy_url(dsn: str) -> URL:
    """The libpq DSN as a SQLAlchemy URL for the psycopg 3 driver (a socket directory goes in ``host``)."""
    params = conninfo_to_dict(dsn)
    query: dict[str, str] = {key: str(params[key]) for key in ("host", "port") if key in params}
    return URL.create("postgresql+psycopg", username=str(params.get("user", "")) or None,
                      password=str(params["password"]) if "password" in params else None,
                      database=str(params.get("dbname", "")) or None, query=query)


def main() -> None:
    global POOL
    args = peer_arguments(__doc__.splitlines()[0]).parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    POOL = ConnectionPool(args.dsn, min_size=args.concurrency, max_size=args.concurrency,
                          kwargs={"autocommit": True}, open=True)
    POOL.wait()
    store = SQLAlchemyJobStore(url=sqlalchemy_url(args.dsn), tablename="apscheduler_jobs")
    scheduler = BackgroundScheduler(jobstores={"default": store},
                                    executors={"default": ThreadPoolExecutor(args.concurrency)},
                                    job_defaults={"misfire_grace_time": None}, timezone=UTC)
    scheduler.start(paused=True)
    scheduler.remove_all_jobs()  # an earlier repetition's
    if args.workload == "burst":
        now = datetime.now(UTC)
        for row in range(args.jobs):
            scheduler.add_job(touch, "date", run_date=now, args=(row,), id=f"touch-{row}")
        say("ready")
        hear("go")
        scheduler.resume()
    else:
        for job in range(args.jobs):
            first = args.anchor + tick_offset(job, args.jobs, args.phase)
            scheduler.add_job(tick, "interval", seconds=1, start_date=datetime.fromtimestamp(first, UTC),
                              args=(job,), id=f"tick-{job}")
        scheduler.add_listener(record, EVENT_JOB_EXECUTED)
        scheduler.resume()
        say("ready")
        hear("go")
    hear("stop")
    scheduler.shutdown(wait=True)
    with POOL.connection() as conn, conn.transaction(), conn.cursor() as cursor:
        cursor.executemany(INSERT_TICK, [("apscheduler", job, planned, started) for job, planned, started in RUNS])
    POOL.close()
    say("stopped")


if __name__ == "__main__":
    main()
