"""Compare: radixjobs, procrastinate and APScheduler side by side on one server, in one run.

Every peer runs in its own subprocess (radixjobs: ``radixjobs serve``; the others: bench/peers/) on the
scenario's database, one after the other, against the one-connection commit rate measured in the same
repetition. Two workloads:

- burst: ``--jobs`` (5,000) jobs due at once, each updating one row of ``bench.touched`` (the same UPDATE
  for every peer; radixjobs calls it as the atomic procedure ``bench.touch_at``). jobs/s = jobs run /
  (last − first ``clock_timestamp()`` written by the bodies); CPU per job of the scheduler's process and
  of the server's processes (postmaster and its children, from /proc) between ``go`` and the last row.
- ticks: ``--tick-jobs`` (200) jobs every second for ``--seconds`` (60) after a 3 s warm-up. Lateness =
  the body's first timestamp − its planned tick (radixjobs: ``bench.tick``, as the lateness scenario;
  the peers: bench/peers/); missed = ticks planned in the window that never ran.

Three more, on whole minutes, for radixjobs and pg_cron (bench/scenarios/compare_cron.py): ``minute-burst``,
``minutely`` and ``overrun``. With pg_cron among ``--peers`` and one of them among ``--workloads``, the
server is a distribution PostgreSQL with pg_cron preloaded (bench/distribution.py; ``--pg-bin`` picks its
binaries, ``--dsn`` a server of yours that preloads pg_cron), not the embedded one.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from distribution import pg_cron_bin, pg_cron_cluster
from harness import BenchDatabase, CpuMeter, Daemon, clone_jobs, percentile, wait_for
from peers import MINUTE_WORKLOADS, PEERS, PeerProcess, tick_offset
from scenarios import baseline, compare_cron
from scenarios.compare_table import render  # noqa: F401  (bench/run.py prints the table with it)

ALL_PEERS = ("radixjobs", *PEERS)
NS = 1_000_000_000
WARM_UP_S = 3.0

SETUP_SQL = """
CREATE TABLE bench.touched (id integer PRIMARY KEY, n bigint NOT NULL DEFAULT 0, at timestamptz);
CREATE PROCEDURE bench.touch_at(row_id integer) LANGUAGE sql
    BEGIN ATOMIC UPDATE bench.touched SET n = n + 1, at = clock_timestamp() WHERE id = row_id; END;
CREATE TABLE bench.peer_ticks (peer text NOT NULL, job integer NOT NULL, planned timestamptz NOT NULL,
                               started timestamptz NOT NULL);
"""
BURST_JOB = """
SELECT radix.create_job(%s, jsonb_build_object('at', clock_timestamp()::text), %s, 'bench.touch_at',
                        jsonb_build_object('row_id', 0))
"""
TICK_JOB = "SELECT radix.create_job(%s, jsonb_build_object('every', '1 second'), %s, 'bench.tick')"
STATES_OF = """
UPDATE radix.radix_system_job_state SET due_ns = {due}
WHERE job_id IN (SELECT job_id FROM radix.jobs WHERE schema_name = 'bench' AND job_name LIKE %s)
"""
BURST_DONE = """
SELECT count(*) FILTER (WHERE n > 0), count(*) FILTER (WHERE n = 1), coalesce(sum(n), 0),
       extract(epoch FROM max(at) - min(at))::float8
FROM bench.touched
"""
# radixjobs ticks: per job, ticks planned inside [w0, w1) of its grid (anchor + k·interval), and those run.
RADIX_TICKS = """
WITH w AS (SELECT %(w0)s::bigint AS w0, %(w1)s::bigint AS w1),
mine AS (SELECT job_id, interval_ns FROM radix.jobs WHERE schema_name = 'bench' AND job_name LIKE %(like)s),
expected AS (
    SELECT greatest(0, (w.w1 - 1 - s.anchor_ns) / m.interval_ns - (w.w0 - 1 - s.anchor_ns) / m.interval_ns) AS n
    FROM radix.radix_system_job_state s JOIN mine m USING (job_id), w
),
ran AS (
    SELECT t.job::text AS job, radix.to_ns(t.planned) AS planned_ns,
           extract(epoch FROM t.started - t.planned) * 1000 AS late_ms
    FROM bench.ticks t JOIN mine m ON m.job_id = t.job, w
    WHERE radix.to_ns(t.planned) >= w.w0 AND radix.to_ns(t.planned) < w.w1
)
SELECT (SELECT sum(n) FROM expected), (SELECT count(DISTINCT (job, planned_ns)) FROM ran),
       (SELECT count(*) FROM (SELECT 1 FROM ran GROUP BY job, planned_ns HAVING count(*) > 1) d),
       (SELECT array_agg(late_ms::float8) FROM ran)
"""
PEER_TICKS = """
WITH ran AS (
    SELECT job, planned, extract(epoch FROM started - planned) * 1000 AS late_ms FROM bench.peer_ticks
    WHERE peer = %(peer)s AND planned >= to_timestamp(%(w0)s) AND planned < to_timestamp(%(w1)s)
)
SELECT (SELECT count(DISTINCT (job, planned)) FROM ran),
       (SELECT count(*) FROM (SELECT 1 FROM ran GROUP BY job, planned HAVING count(*) > 1) d),
       (SELECT array_agg(late_ms::float8) FROM ran)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    baseline.add_arguments(parser)
    parser.add_argument("--jobs", type=int, default=5_000, help="burst: jobs due at once (default 5000)")
    parser.add_argument("--tick-jobs", type=int, default=200, help="ticks: jobs every second (default 200)")
    parser.add_argument("--seconds", type=float, default=60.0, help="ticks: measurement window (default 60)")
    parser.add_argument("--phase", choices=("aligned", "spread"), default="aligned",
                        help="ticks all due at the same instant (default), or spread over the second "
                             "(procrastinate's cron stays aligned)")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="jobs at once, every peer (default 16: the daemon's per database)")
    parser.add_argument("--peers", type=peer_list, default=list(ALL_PEERS),
                        help=f"comma-separated, of {','.join(ALL_PEERS)} (default all)")
    parser.add_argument("--workloads", type=workload_list, default=["burst", "ticks"],
                        help=f"comma-separated, of {','.join(WORKLOADS)} (default burst,ticks); burst and ticks "
                             f"run every peer but pg_cron, the others radixjobs and pg_cron")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions; the table shows medians (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="burst: seconds a peer may take before it is stopped; minute workloads: seconds "
                             "after the last due minute and its work (default 300)")
    compare_cron.add_arguments(parser)


def _choices(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in allowed]
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)}, got {text!r}")
        return [name for name in allowed if name in items]
    return parse


WORKLOADS = ("burst", "ticks", *MINUTE_WORKLOADS)
peer_list = _choices(ALL_PEERS)
workload_list = _choices(WORKLOADS)


def runs_on(workload: str, peer: str) -> bool:
    """pg_cron and pgAgent schedule whole minutes only; procrastinate and APScheduler are not in the minute
    workloads."""
    return (peer in compare_cron.CRON_PEERS) if workload in MINUTE_WORKLOADS else peer not in ("pg_cron", "pgagent")


def needs_cron_cluster(args: argparse.Namespace) -> bool:
    """pg_cron (preloaded) or pgAgent (its extension: the distribution's packages) in a minute workload."""
    return (any(p in args.peers for p in ("pg_cron", "pgagent"))
            and any(w in MINUTE_WORKLOADS for w in args.workloads))


@contextlib.contextmanager
def server(args: argparse.Namespace) -> Iterator[str | None]:
    """The superuser DSN bench/run.py makes the scenario's database on: a distribution PostgreSQL with pg_cron
    preloaded when pg_cron takes part and no ``--dsn`` is given; else ``--dsn`` (None: the embedded one)."""
    if not needs_cron_cluster(args) or args.dsn is not None:
        yield args.dsn
        return
    bin_dir = args.pg_bin or pg_cron_bin()
    if bin_dir is None:
        raise SystemExit("compare: pg_cron is not installed (Debian: apt-get install postgresql-15-cron), "
                         "or give --dsn of a server that preloads it")
    with pg_cron_cluster(bin_dir) as dsn:
        yield dsn


def measure_baseline(db: BenchDatabase, seconds: float) -> dict[str, float]:
    """One connection's commit rate (single-row UPDATEs, autocommit, as the baseline scenario), and the CPU
    of one commit (client process + server)."""
    meter = CpuMeter(db)
    client = time.process_time()
    commits = baseline.commit_loop(db.dsn, -1, time.time(), seconds, meter)
    client = time.process_time() - client
    return {"commits_per_s": commits / seconds, "client_cpu_us": client / commits * 1e6,
            "server_cpu_us": meter.used()["server"] / commits * 1e6}


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def run_burst(db: BenchDatabase, peer: str, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    with db.connect() as conn:
        conn.execute(b"TRUNCATE bench.touched")
        conn.execute(b"INSERT INTO bench.touched (id) SELECT g FROM generate_series(0, %s) g", (args.jobs - 1,))
        conn.execute(b"VACUUM ANALYZE bench.touched")
    load = _load()
    if peer == "radixjobs":
        like = f"c{rep}\\_%"
        with db.connect() as conn:
            conn.execute(BURST_JOB.encode(), (f"bench.c{rep}_0", db.principal))
            clone_jobs(conn, f"c{rep}_0", f"c{rep}_", args.jobs - 1, vary=True)
            conn.execute(STATES_OF.format(due="NULL").encode(), (like,))  # held back until the daemon is up
        runner: Daemon | PeerProcess = Daemon(db.dsn, f"bench-compare-{rep}", "--per-database-concurrency",
                                              str(args.concurrency), "--concurrency", str(max(32, args.concurrency)))
        pid = runner.proc.pid
    else:
        runner = PeerProcess(peer, db.dsn, "burst", args.jobs, args.concurrency)
        pid = runner.pid
    try:
        if isinstance(runner, PeerProcess):
            runner.ready()
        meter = CpuMeter(db, pid)
        if isinstance(runner, Daemon):
            with db.connect() as conn:
                conn.execute(STATES_OF.format(due="planned_ns").encode(), (like,))
                conn.execute(b"NOTIFY radix_jobs")
        else:
            runner.go()
        timed_out = False
        try:
            wait_for(lambda: db.scalar("SELECT count(*) = %s FROM bench.touched WHERE n > 0", (args.jobs,)),
                     timeout=args.timeout, interval=0.1, message=f"{peer} to run the burst")
        except TimeoutError:
            timed_out = True
        cpu = meter.used()
    finally:
        runner.stop()
    with db.connect() as conn:
        row = conn.execute(BURST_DONE.encode()).fetchone()
    assert row is not None
    done, once, total, span = int(row[0]), int(row[1]), int(row[2]), float(row[3] or 0.0)
    return {"jobs": args.jobs, "done": done, "exactly_once": once == args.jobs and total == args.jobs,
            "timed_out": timed_out, "span_s": round(span, 3),
            "jobs_per_s": round(done / span, 1) if span > 0 else None,
            "scheduler_cpu_us_per_job": round(cpu["daemon"] / max(done, 1) * 1e6),
            "server_cpu_us_per_job": round(cpu["server"] / max(done, 1) * 1e6),
            "load_avg_1m_before": load, "load_avg_1m_after": _load()}


def _lateness(expected: int, ran: int, duplicates: int, late: list[float]) -> dict[str, Any]:
    result: dict[str, Any] = {"ticks_expected": expected, "ticks_run": ran, "ticks_missed": expected - ran,
                              "duplicate_ticks": duplicates}
    if late:
        result |= {"lateness_p50_ms": round(percentile(late, 0.50), 2),
                   "lateness_p99_ms": round(percentile(late, 0.99), 2),
                   "lateness_max_ms": round(max(late), 2)}
    return result


def peer_expected(jobs: int, phase: str, w0: float, w1: float) -> int:
    """Grid points (whole second + the job's offset) inside [w0, w1), summed over the jobs."""
    total = 0
    for job in range(jobs):
        offset = tick_offset(job, jobs, phase)
        total += max(0, math.ceil(w1 - offset) - math.ceil(w0 - offset))
    return total


def run_ticks(db: BenchDatabase, peer: str, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    jobs, load = args.tick_jobs, _load()
    phase = "aligned" if peer == "procrastinate" else args.phase
    if peer == "radixjobs":
        like = f"k{rep}\\_%"
        with db.connect() as conn:
            conn.execute(TICK_JOB.encode(), (f"bench.k{rep}_0", db.principal))
            spread_ns = (jobs - 1) * NS // jobs if phase == "spread" else 0
            clone_jobs(conn, f"k{rep}_0", f"k{rep}_", jobs - 1, vary=False, spread_ns=spread_ns)
        runner: Daemon | PeerProcess = Daemon(db.dsn, f"bench-compare-ticks-{rep}", "--per-database-concurrency",
                                              str(args.concurrency), "--concurrency", str(max(32, args.concurrency)))
        pid = runner.proc.pid
    else:
        with db.connect() as conn:
            conn.execute(b"DELETE FROM bench.peer_ticks WHERE peer = %s", (peer,))
            conn.execute(b"INSERT INTO bench.touched (id) SELECT g FROM generate_series(0, %s) g "
                         b"ON CONFLICT DO NOTHING", (jobs - 1,))
        anchor = math.ceil(time.time()) + 1
        runner = PeerProcess(peer, db.dsn, "ticks", jobs, args.concurrency, "--anchor", str(anchor),
                             "--phase", phase)
        pid = runner.pid
    try:
        if isinstance(runner, PeerProcess):
            runner.ready()
            runner.go()
        time.sleep(WARM_UP_S)
        w0 = time.time()
        meter = CpuMeter(db, pid)
        time.sleep(args.seconds)
        cpu = meter.used()
        w1 = w0 + args.seconds
        time.sleep(2.0)  # the window's last ticks finish
    finally:
        runner.stop()
    with db.connect() as conn:
        if peer == "radixjobs":
            row = conn.execute(RADIX_TICKS.encode(), {"w0": int(w0 * NS), "w1": int(w1 * NS), "like": like}).fetchone()
            assert row is not None
            expected, counts = int(row[0] or 0), row[1:]
            conn.execute(b"SELECT count(radix.drop_job('bench.' || job_name)) FROM radix.jobs "
                         b"WHERE schema_name = 'bench' AND job_name LIKE %s", (like,))
        else:
            counts = conn.execute(PEER_TICKS.encode(), {"peer": peer, "w0": w0, "w1": w1}).fetchone()
            assert counts is not None
            expected = peer_expected(jobs, phase, w0, w1)
    ran, duplicates, late = int(counts[0]), int(counts[1]), list(counts[2] or [])
    return {"jobs": jobs, "phase": phase, "seconds": args.seconds, **_lateness(expected, ran, duplicates, late),
            "scheduler_cpu_percent_of_a_core": round(100 * cpu["daemon"] / args.seconds, 1),
            "server_cpu_percent_of_a_core": round(100 * cpu["server"] / args.seconds, 1),
            "load_avg_1m_before": load, "load_avg_1m_after": _load()}


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


def summarise(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max over the repetitions of every figure of the table."""
    summary: dict[str, Any] = {"baseline_commits_per_s": _spread([r["baseline"]["commits_per_s"] for r in reps]),
                               "baseline_cpu_us_per_commit": _spread(
                                   [r["baseline"]["client_cpu_us"] + r["baseline"]["server_cpu_us"] for r in reps])}
    for peer in reps[0]["peers"]:
        figures: dict[str, list[float]] = {}
        for r in reps:
            base = r["baseline"]
            burst, ticks = r["peers"][peer].get("burst"), r["peers"][peer].get("ticks")
            if burst and burst["jobs_per_s"]:
                cpu = burst["scheduler_cpu_us_per_job"] + burst["server_cpu_us_per_job"]
                for key, value in (("jobs_per_s", burst["jobs_per_s"]),
                                   ("ratio_to_baseline", burst["jobs_per_s"] / base["commits_per_s"]),
                                   ("scheduler_cpu_us_per_job", burst["scheduler_cpu_us_per_job"]),
                                   ("server_cpu_us_per_job", burst["server_cpu_us_per_job"]),
                                   ("cpu_ratio_to_baseline", cpu / (base["client_cpu_us"] + base["server_cpu_us"]))):
                    figures.setdefault(key, []).append(value)
            if ticks:
                for key in ("lateness_p50_ms", "lateness_p99_ms", "ticks_missed", "ticks_expected",
                            "duplicate_ticks"):
                    if key in ticks:
                        figures.setdefault(key, []).append(ticks[key])
            for workload in MINUTE_WORKLOADS:
                for key, value in r["peers"][peer].get(workload, {}).items():
                    if key in compare_cron.FIGURES and value is not None:
                        figures.setdefault(f"{workload}.{key}", []).append(value)
        summary[peer] = {key: _spread(values) for key, values in figures.items()}
    return summary


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    if args.jobs < 1 or args.tick_jobs < 1 or args.seconds <= 0 or args.repeat < 1 or args.concurrency < 1:
        raise SystemExit("compare: --jobs, --tick-jobs, --seconds, --repeat and --concurrency must be positive")
    minute = [w for w in args.workloads if w in MINUTE_WORKLOADS]
    if ("pg_cron" in args.peers and minute
            and db.scalar("SELECT current_setting('cron.database_name', true)") is None):
        raise SystemExit("compare: pg_cron is not preloaded on this server (shared_preload_libraries)")
    with db.connect() as conn:
        conn.execute(SETUP_SQL.encode())
        conn.execute(f'GRANT SELECT, UPDATE ON bench.touched TO "{db.principal}"'.encode())
        if minute:
            conn.execute(compare_cron.SETUP_SQL.encode())
            conn.execute(f'GRANT INSERT ON bench.cron_effects TO "{db.principal}"'.encode())
    reps = []
    runners = {"burst": run_burst, "ticks": run_ticks}
    for rep in range(args.repeat):
        before = measure_baseline(db, args.baseline_seconds)
        one: dict[str, Any] = {"peers": {peer: {} for peer in args.peers}}
        for workload in WORKLOADS:
            if workload in args.workloads:
                for peer in args.peers:
                    if not runs_on(workload, peer):
                        continue
                    one["peers"][peer][workload] = (
                        compare_cron.run_minute(db, peer, workload, args, rep) if workload in MINUTE_WORKLOADS
                        else runners[workload](db, peer, args, rep))
        after = measure_baseline(db, args.baseline_seconds)
        # the commit rate follows the disk's latency, which other work on the machine moves: the mean of
        # a measurement before the repetition's peers and one after them
        one["baseline"] = {key: (before[key] + after[key]) / 2 for key in before}
        one["baseline_before"], one["baseline_after"] = before, after
        reps.append(one)
    settings = {"jobs": args.jobs, "tick_jobs": args.tick_jobs, "seconds": args.seconds, "phase": args.phase,
                "concurrency": args.concurrency, "repeat": args.repeat, "peers": args.peers,
                "workloads": args.workloads, "server_settings": db.settings or "as given by --dsn"}
    if minute:
        settings |= {key: getattr(args, key) for key in ("cron_jobs", "work_ms", "minutely_jobs", "minutes",
                                                          "load_clients", "overrun_seconds", "overrun_minutes")}
        settings["cron_slots"] = compare_cron.CRON_SLOTS
    return {"compare": {"settings": settings, "summary": summarise(reps), "runs": reps}}
