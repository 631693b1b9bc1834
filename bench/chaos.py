"""Chaos run: ``python bench/chaos.py --minutes N [--json] [--seed S] [--nodes 2|3]``.

Two or three ``radixjobs serve`` daemons share one database of a private embedded PostgreSQL, with ~150 jobs
(interval, one-time, 6-field CRON; atomic, non-atomic with radix.once(), failing, conflicting; chains and a
fan-in of SCHEDULE AFTER jobs; two job groups) and CRON_TABLE documents. A seeded driver SIGKILLs and
restarts daemons, restarts PostgreSQL and terminates attempt backends at random moments. Then everything is
stopped cleanly and the effects and the history are checked (see chaos_check.py). Prints the figures and the
violations; the exit code is 1 when there is any violation.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import chaos_check as check
from chaos_faults import DEFAULT_WEIGHTS, Driver, Faults, Node, now_utc
from chaos_setup import World, chaos_world

GRACE_S = 5.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/chaos.py", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=1.0, help="length of the faulty part of the run")
    p.add_argument("--seconds", type=float, default=None, help="length in seconds (overrides --minutes)")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault driver and the job mix")
    p.add_argument("--nodes", type=int, choices=(2, 3), default=3, help="number of daemons")
    p.add_argument("--mean-gap", type=float, default=4.0, help="mean seconds between two faults")
    p.add_argument("--quiet", type=float, default=None,
                   help="seconds without faults at the end (default: 15%% of the run, 8 to 30 s)")
    p.add_argument("--weights", default=",".join(f"{k}={v:g}" for k, v in DEFAULT_WEIGHTS.items()),
                   help="relative frequency of each fault (run_job: RUN JOB on 1-3 recurring jobs)")
    p.add_argument("--max-stall", type=float, default=30.0, help="longest acceptable stall after a kill (s)")
    p.add_argument("--keep", action="store_true", help="keep the temporary server and logs for inspection")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return p


def parse_weights(text: str) -> dict[str, float]:
    weights = {}
    for pair in text.split(","):
        name, _, value = pair.partition("=")
        if name.strip() not in DEFAULT_WEIGHTS:
            raise SystemExit(f"unknown fault {name.strip()!r} (known: {', '.join(DEFAULT_WEIGHTS)})")
        weights[name.strip()] = float(value)
    return weights


def wait_serving(nodes: list[Node], timeout_s: float = 60.0) -> None:
    """Until every node logged its status address (it is serving)."""
    deadline = time.monotonic() + timeout_s
    for node in nodes:
        log = node.logs()[-1]
        while not re.search(r"status: http://", log.read_text(errors="replace")):
            if not node.alive or time.monotonic() > deadline:
                raise RuntimeError(f"{node.name} did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)


def commit() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent, check=False)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def log_problems(nodes: list[Node]) -> int:
    """Tracebacks and ERROR-level lines in the daemons' logs (redaction and crash canaries)."""
    count = 0
    for node in nodes:
        for log in node.logs():
            for line in log.read_text(errors="replace").splitlines():
                if "Traceback" in line or '"level": "error"' in line or '"level": "critical"' in line:
                    count += 1
    return count


def verdict(world: World, faults: Faults, exit_codes: dict[str, int | None], end: dt.datetime,
            args: argparse.Namespace, nodes: list[Node]) -> check.Report:
    report = check.Report()
    with world.connect() as conn:
        check.check_effects(conn, report)
        check.check_ticks(conn, report, world.every_ns)
        check.check_markers(conn, report)
        check.check_requested_runs(conn, report, faults.requested_runs)
        check.check_at_jobs(conn, report, world.at_incarnations)
        check.check_stalls(conn, report, faults.kills, end, args.max_stall)
        check.check_gaps(conn, report, args.max_stall)
        check.check_dependencies(conn, report, world.edges, end, args.max_stall)
        check.check_groups(conn, report, world.groups)
        check.ledger_figures(conn, report)
    unclean = [f"{name} exited {code}" for name, code in exit_codes.items() if code != 0]
    report.violation("unclean_stops", len(unclean), unclean)
    report.violation("unexpected_daemon_exits", len(faults.unexpected_exits), faults.unexpected_exits)
    report.figures.update({
        "kills": len(faults.kills), "daemon_restarts": faults.daemon_restarts,
        "postgres_restarts": faults.postgres_restarts, "terminated_backends": faults.terminated_backends,
        "termination_rounds": faults.termination_rounds, "one_time_recreations": faults.at_recreations,
        "daemon_start_failures_postgres_down": faults.start_failures_postgres_down,
        "driver_errors": len(faults.driver_errors), "daemon_log_errors": log_problems(nodes),
    })
    if faults.driver_errors:
        report.details["driver_errors"] = faults.driver_errors[:10]
    return report


def run(args: argparse.Namespace) -> dict[str, Any]:
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    quiet = args.quiet if args.quiet is not None else min(30.0, max(8.0, 0.15 * seconds))
    rng = random.Random(args.seed)
    started = now_utc()
    with chaos_world(rng, keep=args.keep) as world:
        nodes = [Node(f"chaos-node{i + 1}", world.dsn, world.home, GRACE_S) for i in range(args.nodes)]
        exit_codes: dict[str, int | None] = {}
        try:
            for node in nodes:
                node.start()
            wait_serving(nodes)
            driver = Driver(world, nodes, rng, mean_gap_s=args.mean_gap, weights=parse_weights(args.weights))
            faults = driver.run(seconds, quiet)
        finally:
            for node in nodes:
                exit_codes[node.name] = node.stop(GRACE_S + 30)
        report = verdict(world, faults, exit_codes, now_utc(), args, nodes)
        where = str(world.home) if args.keep else None
    return {"scenario": "chaos", "date": started.isoformat(timespec="seconds"), "commit": commit(),
            "seed": args.seed, "nodes": args.nodes, "seconds": seconds, "quiet_seconds": quiet,
            "figures": report.figures, "violations": report.violations,
            "violations_total": sum(report.violations.values()), "details": report.details, "kept": where}


def emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, default=str))
        return
    print(f"chaos run {result['date']} commit {result['commit']} seed {result['seed']} "
          f"{result['nodes']} nodes {result['seconds']:g} s (quiet {result['quiet_seconds']:g} s)")
    for key, value in result["figures"].items():
        print(f"  {key:<44} {value}")
    print("violations:")
    for key, value in result["violations"].items():
        print(f"  {key:<44} {value}" + ("   <-- VIOLATION" if value else ""))
        for line in result["details"].get(key, []):
            print(f"      {line}")
    for line in result["details"].get("driver_errors", []):
        print(f"  driver error: {line}")
    if result["kept"]:
        print(f"kept: {result['kept']}")


def main() -> None:
    args = parser().parse_args()
    result = run(args)
    emit(result, args.json)
    sys.exit(1 if result["violations_total"] else 0)


if __name__ == "__main__":
    main()
