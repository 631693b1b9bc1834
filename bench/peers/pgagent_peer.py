"""pgAgent as a peer of ``bench/run.py compare``'s minute workloads (protocol: bench/peers/__init__.py).

pgAgent is a daemon outside the server (the distribution's ``pgagent`` binary) that keeps its jobs in the
``pgagent`` schema of the database it connects to (``CREATE EXTENSION pgagent``, made here when missing).
Configured as its documentation shows: one job per ``pga_job`` row, one SQL step (``pga_jobstep``, kind
``s``, ``jstconnstr`` logging in as the scenario's principal on the scenario's socket and database) and one
``pga_schedule``: the workload's minutes true in ``jscminutes`` (the burst's one, or all sixty), the hours,
week days, month days and months all false (any). ``go`` starts ``pgagent -f`` on the scenario's database
as the superuser, at its default poll interval (10 s): each poll, every job whose ``jobnextrun`` has passed
starts in its own thread and connection (pgAgent has no cap on jobs at once); the next run is computed when
a run ends, from that instant, so a minute due while the job runs is skipped. ``stop`` ends the daemon
(SIGTERM); the scenario reads ``pga_joblog`` and then removes the ``bench-`` jobs (their logs go with them).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from peers import cron_command, hear, peer_arguments, say

JOB = """
WITH job AS (INSERT INTO pgagent.pga_job (jobjclid, jobname)
             SELECT jclid, %(name)s FROM pgagent.pga_jobclass WHERE jclname = 'Miscellaneous' RETURNING jobid),
step AS (INSERT INTO pgagent.pga_jobstep (jstjobid, jstname, jstkind, jstcode, jstconnstr)
         SELECT jobid, 'run', 's', %(code)s, %(connstr)s FROM job)
INSERT INTO pgagent.pga_schedule (jscjobid, jscname, jscstart, jscminutes)
SELECT jobid, 'schedule', now(), %(minutes)s::bool[] FROM job
"""


def minutes_array(workload: str, first_due: float) -> list[bool]:
    """pgAgent's ``jscminutes``: the burst's one minute of the hour, else every minute. (All false would not
    do: pgAgent's next run is then a minute later than the next minute.)"""
    return [workload != "minute-burst" or m == int(first_due) // 60 % 60 for m in range(60)]


def main() -> None:
    args = peer_arguments(__doc__.splitlines()[0]).parse_args()
    if args.workload not in ("minute-burst", "minutely", "overrun"):
        raise SystemExit(f"pgagent peer: no {args.workload!r} workload (pgAgent schedules whole minutes)")
    binary = shutil.which("pgagent")
    if binary is None:
        raise SystemExit("pgagent peer: the pgagent binary is not installed (Debian: apt-get install pgagent)")
    params = conninfo_to_dict(args.dsn)
    job_params = {**params, "user": args.run_as}
    job_params.pop("password", None)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(b"CREATE EXTENSION IF NOT EXISTS pgagent")
        conn.execute(b"DELETE FROM pgagent.pga_job WHERE jobname LIKE 'bench-%'")
        minutes = minutes_array(args.workload, args.minute)
        for job in range(args.jobs):
            conn.execute(JOB.encode(), {"name": f"bench-{job}", "code": cron_command(job, args.work_ms),
                                        "connstr": make_conninfo(**job_params), "minutes": minutes})
    say("ready")
    hear("go")
    agent = subprocess.Popen([binary, "-f", "-l", "0", args.dsn], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hear("stop")
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(30)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait(10)
    say("stopped")


if __name__ == "__main__":
    main()
