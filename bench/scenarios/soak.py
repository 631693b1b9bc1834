"""Soak: jobs EVERY 1 second run by radixjobs serve for a long window; table sizes, lateness, WAL, autovacuum.

``--jobs`` (1,000) jobs every second for ``--seconds`` (1,000): a million attempts of bench.tick, set up and
measured as the lateness scenario does (its functions). Over the window: the size on disk of every table of
the radix schema (pg_total_relation_size: heap, indexes, TOAST) and the daemon's RSS, sampled every
``--sample-seconds``; lateness p50 / p99 / max of the ticks planned in each third of the window, missed and
duplicate ticks over all of it; WAL written (pg_current_wal_lsn before and after) per attempt run, beside the
WAL per attempt of the floor scenario's unit of work measured in the same run before the daemon starts
(``--floor-attempts`` bench.touch calls on ``--floor-connections`` connections, one per transaction, nothing
else writing); the radix tables' pg_stat_user_tables at the end (live and dead rows, autovacuums); daemon and
server CPU (the server's exited processes counted, autovacuum workers among them). History is pruned in the
tick's transaction (each job keeps its newest 256 rows by default), so the history table plateaus once every
job has that many.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import psutil
import psycopg

from harness import BenchDatabase, CpuMeter
from scenarios import baseline, floor, lateness

NS = lateness.NS
TOP_TABLES = 4  # the biggest tables shown one by one (all of them are in the total)

SIZES = """
SELECT c.relname, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'radix' AND c.relkind IN ('r', 'p', 'm')
"""

VACUUM_STATS = """
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, last_autovacuum
FROM pg_stat_user_tables WHERE schemaname = 'radix' ORDER BY pg_total_relation_size(relid) DESC, relname
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    baseline.add_arguments(parser)
    parser.add_argument("--jobs", type=int, default=1_000, help="jobs EVERY 1 second (default 1000)")
    parser.add_argument("--seconds", type=float, default=1_000.0, help="measurement window (default 1000)")
    parser.add_argument("--sample-seconds", type=float, default=30.0,
                        help="seconds between samples of the table sizes and the daemon's RSS (default 30)")
    parser.add_argument("--concurrency", type=int, default=16, help="per-database concurrency (daemon default 16)")
    parser.add_argument("--floor-attempts", type=int, default=10_000,
                        help="attempts of the floor's unit of work whose WAL is measured (default 10000)")
    parser.add_argument("--floor-connections", type=int, default=8, help="the floor's connections (default 8)")


def wal_lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(b"SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_since(conn: psycopg.Connection[Any], lsn: str) -> int:
    row = conn.execute(b"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (lsn,)).fetchone()
    assert row is not None
    return int(row[0])


def measure_floor(db: BenchDatabase, attempts: int, connections: int) -> dict[str, Any]:
    """WAL bytes per attempt (and attempts/s) of the floor's unit of work: ``attempts`` bench.touch calls sent
    as the daemon sends a tick, one per transaction, on ``connections`` principal connections."""
    with db.connect() as conn:
        conn.execute(b"INSERT INTO bench.counters (id) SELECT g FROM generate_series(0, %s) g ON CONFLICT DO NOTHING",
                     (attempts - 1,))
        before = wal_lsn(conn)
        measured = floor.measure(db, connections, attempts)
        wal = wal_since(conn, before)
    return {"attempts": attempts, "connections": connections, "attempts_per_s": round(measured["attempts_per_s"]),
            "wal_bytes": wal, "wal_bytes_per_attempt": round(wal / attempts)}


def sample(conn: psycopg.Connection[Any], daemon: psutil.Process, elapsed: float) -> dict[str, Any]:
    sizes = {str(name): int(size) for name, size in conn.execute(SIZES.encode()).fetchall()}
    return {"seconds": round(elapsed, 1), "total_bytes": sum(sizes.values()), "tables": sizes,
            "daemon_rss_mb": round(daemon.memory_info().rss / 2**20, 1)}


def at_points(samples: list[dict[str, Any]], value: Callable[[dict[str, Any]], Any], seconds: float) -> dict[str, Any]:
    """``value(sample)`` at the first sample, the one nearest the middle of the window, the last, and its max."""
    middle = min(samples, key=lambda s: abs(s["seconds"] - seconds / 2))
    values = [value(s) for s in samples]
    return {"start": values[0], "middle": value(middle), "end": values[-1], "max": max(values)}


def table_size(name: str) -> Callable[[dict[str, Any]], int]:
    return lambda sample: int(sample["tables"].get(name, 0))


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    one = baseline.measure(db, 1, args.baseline_seconds)
    floor_figures = measure_floor(db, args.floor_attempts, args.floor_connections)
    lateness.create_jobs(db, args.jobs, "spread")
    daemon = lateness.start_daemon(db, "bench-soak", args.concurrency, [])
    samples: list[dict[str, Any]] = []
    try:
        process = psutil.Process(daemon.proc.pid)
        time.sleep(3.0)  # start-up: connections, first claims
        with db.connect() as conn:
            row = conn.execute(b"SELECT radix.to_ns(clock_timestamp()), pg_current_wal_lsn()::text").fetchone()
            assert row is not None
            w0, lsn0 = int(row[0]), str(row[1])
            meter = CpuMeter(db, daemon.proc.pid, count_exited=True)
            started = time.monotonic()
            samples.append(sample(conn, process, 0.0))
            while (elapsed := time.monotonic() - started) < args.seconds:
                time.sleep(max(0.0, min(args.sample_seconds * len(samples), args.seconds) - elapsed))
                if time.monotonic() - started >= args.seconds:
                    break
                samples.append(sample(conn, process, time.monotonic() - started))
            wal = wal_since(conn, lsn0)
            meter.stop()
            elapsed = time.monotonic() - started
            samples.append(sample(conn, process, elapsed))
            vacuum = [{"table": r[0], "n_live_tup": r[1], "n_dead_tup": r[2], "autovacuum_count": r[3],
                       "last_autovacuum": r[4].isoformat(timespec="seconds") if r[4] else None}
                      for r in conn.execute(VACUUM_STATS.encode()).fetchall()]
        w1 = w0 + int(args.seconds * NS)
        time.sleep(2.0)  # the window's last ticks finish
    finally:
        daemon.stop()
    cpu = meter.used()
    whole = lateness.window_ticks(db, w0, w1)
    thirds = {}
    for index, name in enumerate(("start", "middle", "end")):
        third = lateness.window_ticks(db, w0 + (w1 - w0) * index // 3, w0 + (w1 - w0) * (index + 1) // 3)
        thirds[name] = {"ticks_run": third["ticks_run"],
                        **{key: value for key, value in third.items() if key.startswith("lateness_")}}
    end_sizes = samples[-1]["tables"]
    biggest = sorted(end_sizes, key=lambda name: (-end_sizes[name], name))[:TOP_TABLES]
    attempts = whole["ticks_run"]
    result: dict[str, Any] = {
        "jobs": args.jobs, "seconds": args.seconds, "sample_seconds": args.sample_seconds,
        "concurrency": args.concurrency,
        **{key: whole[key] for key in ("ticks_expected", "ticks_run", "ticks_missed", "duplicate_ticks")},
        "lateness": {**thirds, "whole": {key: value for key, value in whole.items() if key.startswith("lateness_")}},
        "size_bytes": {"total": at_points(samples, lambda s: s["total_bytes"], elapsed),
                       **{name: at_points(samples, table_size(name), elapsed) for name in biggest}},
        "daemon_rss_mb": at_points(samples, lambda s: s["daemon_rss_mb"], elapsed),
        "wal": {"bytes": wal, "bytes_per_attempt": round(wal / attempts) if attempts else None,
                "floor": floor_figures},
        "daemon_cpu_percent_of_a_core": round(100 * cpu["daemon"] / elapsed, 1),
        "server_cpu_percent_of_a_core": round(100 * cpu["server"] / elapsed, 1),
        "autovacuum": vacuum,
        "samples": [{key: value for key, value in s.items() if key != "tables"}
                    | {name: s["tables"].get(name, 0) for name in biggest} for s in samples],
    }
    return {"soak": result, "baseline": {"one_connection_commits_per_s": round(one)}}


def _mb(size: int) -> str:
    return f"{size / 2**20:,.1f}"


def render(document: dict[str, Any]) -> str:
    soak = document["soak"]
    lines = [f"soak: {soak['jobs']:,} jobs every second for {soak['seconds']:,g} s, concurrency {soak['concurrency']}; "
             f"ticks expected {soak['ticks_expected']:,}, run {soak['ticks_run']:,}, missed {soak['ticks_missed']:,}, "
             f"duplicate {soak['duplicate_ticks']:,}",
             "", f"{'':<34}{'start':>10}{'middle':>10}{'end':>10}{'max':>10}"]
    for name, points in soak["size_bytes"].items():
        label = "radix tables MB (all)" if name == "total" else f"  {name}"
        lines.append(f"{label:<34}" + "".join(f"{_mb(points[k]):>10}" for k in ("start", "middle", "end", "max")))
    rss = soak["daemon_rss_mb"]
    lines.append(f"{'daemon RSS MB':<34}" + "".join(f"{rss[k]:>10,.1f}" for k in ("start", "middle", "end", "max")))
    lines += ["", f"{'lateness ms, ticks planned in':<34}{'1st third':>10}{'2nd third':>10}{'3rd third':>10}"
              f"{'whole':>10}"]
    late = soak["lateness"]
    for figure in ("p50", "p99", "max"):
        key = f"lateness_{figure}_ms"
        cells = [late[part].get(key) for part in ("start", "middle", "end", "whole")]
        lines.append(f"{'  ' + figure:<34}" + "".join("–".rjust(10) if c is None else f"{c:>10.2f}" for c in cells))
    wal, floor_wal = soak["wal"], soak["wal"]["floor"]
    lines += ["", f"WAL per attempt: {wal['bytes_per_attempt'] or 0:,} B ({_mb(wal['bytes'])} MB over the window); "
              f"floor: {floor_wal['wal_bytes_per_attempt']:,} B ({floor_wal['attempts']:,} bench.touch attempts on "
              f"{floor_wal['connections']} connections, {floor_wal['attempts_per_s']:,}/s)",
              f"CPU, % of a core: daemon {soak['daemon_cpu_percent_of_a_core']}, "
              f"server {soak['server_cpu_percent_of_a_core']}",
              f"baseline: one-connection commits/s {document['baseline']['one_connection_commits_per_s']:,}",
              "", f"{'autovacuum at the end':<34}{'live':>10}{'dead':>10}{'autovac.':>10}  last"]
    for table in soak["autovacuum"]:
        if table["n_live_tup"] or table["n_dead_tup"] or table["autovacuum_count"]:
            lines.append(f"  {table['table']:<32}{table['n_live_tup']:>10,}{table['n_dead_tup']:>10,}"
                         f"{table['autovacuum_count']:>10,}  {table['last_autovacuum'] or '–'}")
    env = document.get("environment", {})
    lines += ["", f"date {env.get('date_utc')}  commit {env.get('commit')}  server {env.get('server_version')}  "
                  f"cpus {env.get('cpus')}  load avg 1m {env.get('load_avg_1m')}  (--json for every sample)"]
    return "\n".join(lines)
