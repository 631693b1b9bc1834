"""pg_cron as a peer of ``bench/run.py compare``'s minute workloads (protocol: bench/peers/__init__.py).

pg_cron's scheduler is a background worker inside the server (the ``pg_cron launcher``), so this process
only defines and removes jobs; the CPU of the scheduler and of its job sessions is the server's. Configured
as pg_cron's README shows for jobs in another database than its own: ``cron.schedule_in_database(name,
schedule, command, database, username)``, called by a superuser in pg_cron's database
(``cron.database_name``), each job run as the scenario's principal in the scenario's database, over
libpq (pg_cron's default, ``cron.use_background_workers = off``), at most ``cron.max_running_jobs`` (32 by
default) at once; the server's settings are whatever the cluster has (bench/distribution.py).

- setup: N jobs ``--jobs``, named ``bench-<i>``, with the workload's cron expression and ``CALL
  bench.cron_work(i, work_ms)``; jobs left by an earlier repetition are removed first.
- ``go``: nothing to start (the launcher is running; the jobs are due at their minute).
- ``stop``: ``cron.unschedule`` of every ``bench-`` job. A run in progress is not stopped by that (the
  scenario ends any body still running); pg_cron drops the runs it had queued but not started.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from peers import cron_command, cron_expression, hear, peer_arguments, say

UNSCHEDULE = b"SELECT count(cron.unschedule(jobid)) FROM cron.job WHERE jobname LIKE 'bench-%'"


def cron_connection(dsn: str) -> tuple[psycopg.Connection[Any], str]:
    """A connection to pg_cron's database, and the name of the scenario's database (``dsn``'s)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(b"SELECT current_database(), current_setting('cron.database_name')").fetchone()
    assert row is not None
    params = conninfo_to_dict(dsn)
    params["dbname"] = row[1]
    return psycopg.connect(make_conninfo(**params), autocommit=True), str(row[0])  # type: ignore[arg-type]


def main() -> None:
    args = peer_arguments(__doc__.splitlines()[0]).parse_args()
    if args.workload not in ("minute-burst", "minutely", "overrun"):
        raise SystemExit(f"pg_cron peer: no {args.workload!r} workload (pg_cron schedules whole minutes)")
    conn, database = cron_connection(args.dsn)
    with conn:
        conn.execute(UNSCHEDULE)
        expression = cron_expression(args.workload, args.minute)
        for job in range(args.jobs):
            conn.execute(b"SELECT cron.schedule_in_database(%s, %s, %s, %s, %s)",
                         (f"bench-{job}", expression, cron_command(job, args.work_ms), database, args.run_as))
        say("ready")
        hear("go")
        hear("stop")
        conn.execute(UNSCHEDULE)
    say("stopped")


if __name__ == "__main__":
    main()
