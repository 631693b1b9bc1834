"""Failover: two radixjobs serve on one database; one is killed (SIGKILL) while it runs attempts.

Measured per round: seconds from the kill until every job the killed node held has started again on
the surviving node (its history row, database clock), and how many of those restarts were resumptions
of the same tick (same planned time and idempotency key) rather than the next tick.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from harness import BenchDatabase, Daemon, clone_jobs, wait_for

NS = 1_000_000_000

CREATE_JOB = """
SELECT radix.create_job('bench.f0', jsonb_build_object('every', '1 second'), %s, 'bench.slow',
                        jsonb_build_object('ms', %s))
"""
# The node's attempts in progress: its one-transaction ticks, read from their query text (radix.run_tick's job,
# tick and node id in hex: engine/ticks.py), and its leases (published ticks, claims).
HELD = """
SELECT substring(a.query FROM 'run_tick\\(''([0-9a-f-]+)''')::uuid,
       substring(a.query FROM 'run_tick\\(''[0-9a-f-]+''::pg_catalog.uuid, ''([0-9]+)''')::bigint
FROM pg_stat_activity a
WHERE a.application_name = 'radixjobs-attempt' AND a.state = 'active' AND a.query LIKE '%%run_tick%%'
  AND strpos(a.query, %s) > 0
UNION
SELECT job_id, planned_ns FROM radix.radix_system_job_state WHERE lease_node = %s AND status = 'running'
"""
# For each held job: the first attempt started by another node after the kill.
TAKEN_OVER = """
SELECT h.job_id, min(h.started_at) AS started, bool_or(h.planned_ns = held.planned_ns) AS resumed
FROM radix.radix_system_job_history h
JOIN unnest(%s::uuid[], %s::bigint[]) AS held(job_id, planned_ns) ON held.job_id = h.job_id
WHERE h.node <> %s AND h.started_at > %s
GROUP BY h.job_id
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=6,
                        help="jobs EVERY 1 second (default 6: fewer than one node's 8 slots, so the survivor "
                             "has room for the victim's jobs and the figure is detection, not capacity)")
    parser.add_argument("--work-ms", type=int, default=1000, help="each attempt's duration (default 1000 ms)")
    parser.add_argument("--rounds", type=int, default=3, help="kills (default 3)")


def one_round(db: BenchDatabase, victim: Daemon, survivor: Daemon) -> dict[str, Any]:
    with db.connect() as conn:
        node_hex = "'" + victim.node_id.encode().hex() + "'"
        held = wait_for(lambda: conn.execute(HELD.encode(), (node_hex, victim.node_id)).fetchall(), timeout=30,
                        message=f"{victim.node_id} to hold claims", interval=0.01)
        victim.kill()
        killed_at = conn.execute(b"SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        jobs, planned = [row[0] for row in held], [row[1] for row in held]

        def taken_over() -> list[tuple[Any, ...]] | None:
            rows = conn.execute(TAKEN_OVER.encode(), (jobs, planned, victim.node_id, killed_at)).fetchall()
            return rows if len(rows) == len(jobs) else None

        rows = wait_for(taken_over, timeout=60, message="the survivor to take over", interval=0.02)
    delays = [(started - killed_at).total_seconds() for _, started, _ in rows]
    return {"held_claims": len(jobs), "failover_s_max": round(max(delays), 3),
            "failover_s_min": round(min(delays), 3), "resumed_same_tick": sum(1 for *_, r in rows if r),
            "survivor": survivor.node_id}


def run(db: BenchDatabase, args: argparse.Namespace) -> dict[str, Any]:
    with db.connect() as conn:
        conn.execute(CREATE_JOB.encode(), (db.principal, args.work_ms))
        clone_jobs(conn, "f0", "f", args.jobs - 1, vary=False, spread_ns=NS // 2)
    rounds = []
    for index in range(args.rounds):  # a fresh pair each round: the victim starts first, so it holds claims
        victim = Daemon(db.dsn, f"bench-victim-{index}")
        try:
            survivor = Daemon(db.dsn, f"bench-survivor-{index}")
            try:
                time.sleep(2.0)  # both nodes claiming
                rounds.append(one_round(db, victim, survivor))
            finally:
                survivor.stop()
        finally:
            victim.kill()
            victim.stop()
    worst = [r["failover_s_max"] for r in rounds]
    return {"failover": {"jobs": args.jobs, "work_ms": args.work_ms, "rounds": rounds,
                         "failover_s_max": max(worst), "failover_s_median": round(statistics.median(worst), 3)}}
