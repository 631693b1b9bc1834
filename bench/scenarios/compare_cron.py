"""Compare's minute workloads: radixjobs beside pg_cron on pg_cron's home ground, one after the other on one
distribution PostgreSQL with pg_cron preloaded (bench/distribution.py) and in the same database.

- minute-burst: ``--cron-jobs`` (1,000) jobs ``M * * * *``, all due at the same minute M.
- minutely: ``--minutely-jobs`` (1) jobs ``* * * * *`` for ``--minutes`` (10) due minutes, while
  ``--load-clients`` (4) processes commit single-row UPDATEs (the baseline's loop) the whole time.
- overrun: one job ``* * * * *`` whose run takes ``--overrun-seconds`` (90), for ``--overrun-minutes`` (3)
  due minutes.

Every job runs ``CALL bench.cron_work(i, work_ms)`` (``--work-ms``, 100; the overrun's run its seconds),
which records ``clock_timestamp()`` at its start and at its end in ``bench.cron_effects``. Both run as the
scenario's principal, at most 32 at once (pg_cron's default ``cron.max_running_jobs``; radixjobs: ``serve
--per-database-concurrency 32 --max-per-principal 32``). The rest comes from each scheduler's own history:
``cron.job_run_details`` (the minute a pg_cron run was for: its order, cron_figures.by_order) and
``radix.job_history``. Figures:
cron_figures.analyse, history rows written, and for the burst the CPU of the scheduler's process
(radixjobs; pg_cron's launcher is a server process) and of the server from ``ready`` to the last run.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import time
from collections import Counter
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import psutil
import psycopg

from harness import BenchDatabase, CpuMeter, Daemon, clone_jobs, with_dbname
from peers import PeerProcess, cron_expression
from scenarios import baseline
from scenarios.cron_figures import FINAL, Effect, Run, analyse, by_order, by_start, settled_by_order

CRON_SLOTS = 32  # pg_cron's default cron.max_running_jobs; radixjobs is given as many
LEAD_S = 30.0  # the first due minute is at least this far from the workload's start (its setup)
CRON_PEERS = ("radixjobs", "pg_cron", "pgagent")
FIGURES = ("lateness_p50_ms", "lateness_p99_ms", "lateness_max_ms", "start_failures", "missed_minutes", "overlaps",
           "peak_running", "runs_succeeded", "due_runs", "history_rows", "coalesced_ticks", "runs_per_s",
           "scheduler_cpu_ms_per_run", "server_cpu_ms_per_run", "load_commits_per_s")  # compare's summary
PGAGENT_STATUS = {"s": "succeeded", "f": "failed", "i": "failed", "d": "failed", "r": "running"}  # pga_joblog
PREFIXES = {"minute-burst": "cb", "minutely": "cm", "overrun": "co"}  # radixjobs' job names

SETUP_SQL = """
CREATE TABLE bench.cron_effects (job integer NOT NULL, started timestamptz NOT NULL, finished timestamptz NOT NULL);
CREATE PROCEDURE bench.cron_work(job integer, work_ms integer) LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
BEGIN
    IF work_ms > 0 THEN
        PERFORM pg_sleep(work_ms / 1000.0);
    END IF;
    INSERT INTO bench.cron_effects VALUES (job, started, clock_timestamp());
END $$;
"""
RADIX_JOB = """
SELECT radix.create_job(%(name)s, jsonb_build_object('cron', %(cron)s::text, 'time_zone', 'UTC'), %(principal)s,
                        'bench.cron_work', jsonb_build_object('job', 0, 'work_ms', %(work_ms)s::integer),
                        timeout => make_interval(secs => %(timeout_s)s::float8))
"""
RADIX_RUNS = """
SELECT substr(j.job_name, %(cut)s)::integer, h.planned_ns, h.status
FROM radix.radix_system_job_history h JOIN radix.jobs j USING (job_id)
WHERE j.schema_name = 'bench' AND j.job_name LIKE %(like)s
"""
RADIX_PENDING = """
SELECT count(*) FROM radix.radix_system_job_state s JOIN radix.jobs j USING (job_id)
WHERE j.schema_name = 'bench' AND j.job_name LIKE %(like)s AND (s.planned_ns <= %(last)s OR s.planned_ns IS NULL)
"""
RADIX_HOLD = """
UPDATE radix.radix_system_job_state SET due_ns = NULL
WHERE job_id IN (SELECT job_id FROM radix.jobs WHERE schema_name = 'bench' AND job_name LIKE %s)
"""
CRON_JOBS = "SELECT jobid, substr(jobname, 7)::integer FROM cron.job WHERE jobname LIKE 'bench-%'"
CRON_RUNS = """
SELECT jobid, status, return_message FROM cron.job_run_details WHERE runid > %s AND jobid = ANY(%s) ORDER BY runid
"""
END_BODIES = """
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%%bench.cron_work(%%'
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cron-jobs", type=int, default=1000, help="minute-burst: jobs due at one minute (1000)")
    parser.add_argument("--work-ms", type=int, default=100, help="minute-burst, minutely: each run's work (100)")
    parser.add_argument("--minutely-jobs", type=int, default=1, help="minutely: jobs every minute (1)")
    parser.add_argument("--minutes", type=int, default=10, help="minutely: due minutes measured (10)")
    parser.add_argument("--load-clients", type=int, default=4,
                        help="minutely: processes committing single-row UPDATEs meanwhile (4)")
    parser.add_argument("--overrun-seconds", type=float, default=90.0, help="overrun: each run's work (90)")
    parser.add_argument("--overrun-minutes", type=int, default=3, help="overrun: due minutes measured (3)")


def first_minute() -> float:
    """The next whole minute at least LEAD_S away (waiting past a nearer one, so that a job every minute,
    made now, is first due then)."""
    now = time.time()
    due = math.ceil(now / 60) * 60
    if due - now < LEAD_S:
        time.sleep(due - now + 0.5)
        due += 60
    return float(due)


def plan(workload: str, args: argparse.Namespace) -> tuple[int, int, int]:
    """(jobs, due minutes, work ms) of a minute workload."""
    if workload == "minute-burst":
        return args.cron_jobs, 1, args.work_ms
    if workload == "minutely":
        return args.minutely_jobs, args.minutes, args.work_ms
    return 1, args.overrun_minutes, round(args.overrun_seconds * 1000)


class Radix:
    """radixjobs' side: CRON jobs (one through ``radix.create_job``, the others its copies, as compare's
    burst makes them) and one ``radixjobs serve``."""

    def __init__(self, db: BenchDatabase, workload: str, rep: int, first_due: float, jobs: int, work_ms: int):
        self.db, self.prefix = db, f"{PREFIXES[workload]}{rep}_"
        self.like = self.prefix.replace("_", "\\_") + "%"
        with db.connect() as conn:
            conn.execute(RADIX_JOB.encode(), {
                "name": f"bench.{self.prefix}0", "cron": cron_expression(workload, first_due),
                "principal": db.principal, "work_ms": work_ms, "timeout_s": max(240.0, work_ms / 1000 + 60)})
            if jobs > 1:
                clone_jobs(conn, f"{self.prefix}0", self.prefix, jobs - 1, vary=True)
        self.daemon = Daemon(db.dsn, f"bench-cron-{self.prefix}", "--per-database-concurrency", str(CRON_SLOTS),
                             "--concurrency", str(CRON_SLOTS), "--max-per-principal", str(CRON_SLOTS))
        self.pid = self.daemon.proc.pid
        self.conn = db.connect()  # one session polls: a session per poll would count in the server's CPU

    def runs(self) -> list[Run]:
        rows = self.conn.execute(RADIX_RUNS.encode(), {"cut": len(self.prefix) + 1, "like": self.like}).fetchall()
        return [(int(job), planned / 1e9, str(status)) for job, planned, status in rows]

    def settled(self, due: list[float], jobs: int) -> bool:
        del jobs
        row = self.conn.execute(RADIX_PENDING.encode(), {"like": self.like, "last": int(due[-1] * 1e9)}).fetchone()
        return time.time() > due[-1] and row is not None and row[0] == 0

    def stop(self) -> dict[str, Any]:
        with self.db.connect() as conn:
            conn.execute(RADIX_HOLD.encode(), (self.like,))
            conn.execute(END_BODIES.encode())
        self.daemon.stop()
        rows = self.db.scalar("SELECT count(*) FROM radix.job_history WHERE name LIKE %s", (f"bench.{self.like}",))
        coalesced = self.db.scalar(
            "SELECT coalesce(sum(s.coalesced_ticks), 0) FROM radix.radix_system_job_state s JOIN radix.jobs j "
            "USING (job_id) WHERE j.schema_name = 'bench' AND j.job_name LIKE %s", (self.like,))
        return {"history_rows": int(rows), "coalesced_ticks": int(coalesced)}

    def drop(self) -> None:
        with self.conn:
            self.conn.execute(b"SELECT count(radix.drop_job('bench.' || job_name)) FROM radix.jobs "
                              b"WHERE schema_name = 'bench' AND job_name LIKE %s", (self.like,))


class PgCron:
    """pg_cron's side: the peer process (bench/peers/pg_cron_peer.py) defines the jobs; its history is read in
    pg_cron's database."""

    def __init__(self, db: BenchDatabase, workload: str, first_due: float, jobs: int, work_ms: int):
        self.db = db
        self.cron_dsn = with_dbname(db.admin_dsn, str(db.scalar("SELECT current_setting('cron.database_name')")))
        with psycopg.connect(self.cron_dsn) as conn:
            row = conn.execute(b"SELECT coalesce(max(runid), 0) FROM cron.job_run_details").fetchone()
        self.after_runid = int(row[0]) if row else 0
        self.peer = PeerProcess("pg_cron", db.dsn, workload, jobs, CRON_SLOTS, "--minute", str(first_due),
                                "--work-ms", str(work_ms), "--run-as", db.principal)
        self.pid = self.peer.pid
        self.peer.ready()
        self.peer.go()
        self.cron = psycopg.connect(self.cron_dsn, autocommit=True)  # one session polls (see Radix)
        self.jobs = {int(jobid): int(job) for jobid, job in self.cron.execute(CRON_JOBS.encode())}
        self.messages: Counter[str] = Counter()

    def _rows(self) -> list[tuple[int, str, str | None]]:
        """Every run of the workload's jobs (job_run_details outlives cron.unschedule)."""
        rows = self.cron.execute(CRON_RUNS.encode(), (self.after_runid, list(self.jobs))).fetchall()
        return [(self.jobs[int(jobid)], str(status), message) for jobid, status, message in rows]

    def runs_for(self, due: list[float]) -> list[Run]:
        rows = self._rows()
        self.messages = Counter(str(message) for _, status, message in rows if status == "failed")
        return by_order([(job, status) for job, status, _ in rows], due)

    def settled(self, due: list[float], jobs: int) -> bool:
        return settled_by_order(self.runs_for(due), jobs, due)

    def stop(self) -> dict[str, Any]:
        self.peer.stop()  # unschedules: nothing more starts
        with self.db.connect() as conn:
            conn.execute(END_BODIES.encode())
        return {"history_rows": len(self._rows()), "failure_messages": dict(self.messages)}

    def drop(self) -> None:
        self.cron.close()  # the jobs were unscheduled by the peer; pg_cron keeps job_run_details


class PgAgent:
    """pgAgent's side: the peer process (bench/peers/pgagent_peer.py) defines the jobs and runs the ``pgagent``
    daemon, whose CPU is measured; its history, ``pgagent.pga_joblog``, is in the scenario's database."""

    def __init__(self, db: BenchDatabase, workload: str, first_due: float, jobs: int, work_ms: int):
        self.db = db
        self.peer = PeerProcess("pgagent", db.dsn, workload, jobs, CRON_SLOTS, "--minute", str(first_due),
                                "--work-ms", str(work_ms), "--run-as", db.principal)
        self.peer.ready()
        self.peer.go()
        time.sleep(0.5)
        children = psutil.Process(self.peer.pid).children()
        self.pid = children[0].pid if children else self.peer.pid  # the pgagent daemon
        self.conn = db.connect()  # one session polls (see Radix)

    def _rows(self) -> list[tuple[int, float, str]]:
        rows = self.conn.execute(b"SELECT substr(j.jobname, 7)::integer, l.jlgstart, l.jlgstatus "
                                 b"FROM pgagent.pga_joblog l JOIN pgagent.pga_job j ON j.jobid = l.jlgjobid "
                                 b"WHERE j.jobname LIKE 'bench-%'").fetchall()
        return [(int(job), start.timestamp(), PGAGENT_STATUS.get(str(status), str(status)))
                for job, start, status in rows]

    def runs_for(self, due: list[float]) -> list[Run]:
        return by_start(self._rows(), due)

    def settled(self, due: list[float], jobs: int) -> bool:
        """Each job ran its first due minute, and no run that began before the minute after the last is still
        running, 15 s (a poll and a half) after the last due minute."""
        rows = self._rows()
        first = {(job, planned) for job, planned, status in by_start(rows, due) if planned == due[0]
                 and status in FINAL}
        running = any(status == "running" and start < due[-1] + 60 for _, start, status in rows)
        return time.time() > due[-1] + 15 and not running and len(first) == jobs

    def stop(self) -> dict[str, Any]:
        self.peer.stop()
        with self.db.connect() as conn:
            conn.execute(END_BODIES.encode())
        messages = self.conn.execute(
            b"SELECT left(coalesce(nullif(s.jsloutput, ''), '(no output)'), 200), count(*) "
            b"FROM pgagent.pga_jobsteplog s JOIN pgagent.pga_jobstep t ON t.jstid = s.jsljstid "
            b"JOIN pgagent.pga_job j ON j.jobid = t.jstjobid WHERE j.jobname LIKE 'bench-%' AND s.jslstatus <> 's' "
            b"GROUP BY 1").fetchall()
        return {"history_rows": len(self._rows()), "failure_messages": {str(m): int(n) for m, n in messages}}

    def drop(self) -> None:
        with self.conn:
            self.conn.execute(b"DELETE FROM pgagent.pga_job WHERE jobname LIKE 'bench-%'")


class Load:
    """``clients`` processes running the baseline's commit loop from now until ``until``."""

    def __init__(self, db: BenchDatabase, clients: int, until: float):
        self.pool = ProcessPoolExecutor(clients, mp_context=multiprocessing.get_context("fork"))
        self.start, self.until = time.time() + 0.5, until
        self.futures: list[Future[int]] = [
            self.pool.submit(baseline.commit_loop, db.dsn, -100 - i, self.start, until - self.start)
            for i in range(clients)]

    def commits_per_s(self) -> float:
        """Waits for the loops' end."""
        commits = sum(future.result() for future in self.futures)
        self.pool.shutdown()
        return round(commits / (self.until - self.start), 1)


def run_minute(db: BenchDatabase, peer: str, workload: str, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    """One minute workload under one scheduler: its figures (cron_figures.analyse and the history's)."""
    jobs, minutes, work_ms = plan(workload, args)
    with db.connect() as conn:
        conn.execute(b"TRUNCATE bench.cron_effects")
    first_due = first_minute()
    due = [first_due + 60 * k for k in range(minutes)]
    started = time.time()
    side: Radix | PgCron | PgAgent = (
        Radix(db, workload, rep, first_due, jobs, work_ms) if peer == "radixjobs"
        else PgCron(db, workload, first_due, jobs, work_ms) if peer == "pg_cron"
        else PgAgent(db, workload, first_due, jobs, work_ms))
    late_setup = time.time() > first_due - 1
    load = Load(db, args.load_clients, due[-1] + 15) if workload == "minutely" and args.load_clients else None
    time.sleep(max(0.0, first_due - 1 - time.time()))  # the CPU from a second before the minute
    meter = CpuMeter(db, side.pid, count_exited=True)  # pg_cron and pgAgent open a session per run
    deadline = due[-1] + minutes * work_ms / 1000 + args.timeout
    try:
        while not side.settled(due, jobs) and time.time() < deadline:
            time.sleep(1.0)
        timed_out = time.time() >= deadline
        cpu = meter.used()
        elapsed = time.time() - started
        runs = side.runs() if isinstance(side, Radix) else side.runs_for(due)
    finally:
        history = side.stop()
        load_rate = load.commits_per_s() if load else None
    with db.connect() as conn:
        effects: list[Effect] = [(int(job), s.timestamp(), f.timestamp()) for job, s, f in conn.execute(
            b"SELECT job, started, finished FROM bench.cron_effects")]
    side.drop()
    result = {"jobs": jobs, "due_minutes": minutes, "work_ms": work_ms, "first_due_utc":
              time.strftime("%H:%M", time.gmtime(first_due)), "timed_out": timed_out,
              "setup_overran_the_minute": late_setup, **analyse(jobs, due, runs, effects), **history,
              "load_avg_1m": round(os.getloadavg()[0], 2)}
    if load_rate is not None:
        result["load_commits_per_s"] = load_rate
    if workload == "minute-burst":
        result |= burst_figures(effects, cpu, peer) | {"measured_s": round(elapsed, 1)}
    return result


def burst_figures(effects: list[Effect], cpu: dict[str, float], peer: str) -> dict[str, Any]:
    """Runs per second (first to last body start) and CPU per run that ran: the scheduler's process (none of
    its own for pg_cron) and the server's."""
    starts = sorted(started for _, started, _ in effects)
    span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    ran = max(len(effects), 1)
    return {"runs_per_s": round(len(starts) / span, 1) if span > 0 else None,
            "scheduler_cpu_ms_per_run": round(cpu["daemon"] * 1000 / ran, 2) if peer != "pg_cron" else None,
            "server_cpu_ms_per_run": round(cpu["server"] * 1000 / ran, 2)}
