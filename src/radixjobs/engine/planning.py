"""Cron planning: the database cannot evaluate cron expressions, so due cron ticks are planned here.

Invariants:
- Due cron jobs are planned in one transaction, their state rows locked (``FOR UPDATE SKIP LOCKED``), so two
  nodes never plan the same job at once; a plan is stored only while the job is still scheduled at the
  version read.
- A cron tick never runs stale: missed ticks are coalesced to the latest due one (or, with coalesce off, the
  oldest of the ``MAX_MISSED_TICKS`` latest), the skipped ones counted; the walk is bounded
  (``MAX_COALESCE_STEPS``). Under WITH (jitter = J) a later tick counts as due only from J after it (its
  offset is below J), so a due tick is never replaced by one that is not.
- An expression that cannot be evaluated fails its own job (``invalid_schedule``), never the planner.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from radixjobs import schedule
from radixjobs.errors import ScheduleError

MAX_COALESCE_STEPS = 100_000
MAX_MISSED_TICKS = 1_000  # radix.max_missed_ticks(): with coalesce = off, the missed ticks still run

# Cron jobs are found through the partial index jobs_cron, never by reading every job.
DUE_CRON = """
SELECT s.job_id, s.definition_version, s.planned_ns, s.anchor_ns, j.cron_expression, j.cron_time_zone,
       radix.to_ns(clock_timestamp()) AS now_ns, j.coalesce_ticks, coalesce(j.jitter_ns, 0)
FROM radix.jobs j JOIN radix.radix_system_job_state s USING (job_id)
WHERE j.schedule_kind = 'cron' AND s.status = 'scheduled' AND s.request_kind IS NULL
  AND (s.planned_ns IS NULL OR s.due_ns <= radix.to_ns(clock_timestamp()))
FOR UPDATE OF s SKIP LOCKED
"""

# Does a cron job need planning before its tick may be claimed? (Same rows as DUE_CRON, no locks.)
CRON_DUE = """
EXISTS (SELECT 1 FROM radix.jobs j JOIN radix.radix_system_job_state s USING (job_id)
        WHERE j.schedule_kind = 'cron' AND s.status = 'scheduled' AND s.request_kind IS NULL
          AND (s.planned_ns IS NULL OR s.due_ns <= radix.to_ns(clock_timestamp())))
"""

# The tick is due at its jitter offset (radix._jitter_ns), as every tick the database plans.
STORE_PLAN = """
UPDATE radix.radix_system_job_state s SET planned_ns = %(tick)s::bigint,
       due_ns = %(due)s::bigint + radix._jitter_ns(s.job_id, %(tick)s::bigint,
                                                    (SELECT j.jitter_ns FROM radix.jobs j WHERE j.job_id = s.job_id)),
       coalesced_ticks = s.coalesced_ticks + %(skipped)s::bigint, status = %(status)s::text,
       last_error = %(error)s::jsonb, updated_at = clock_timestamp()
WHERE s.job_id = %(job)s::uuid AND s.definition_version = %(version)s::bigint AND s.status = 'scheduled'
"""


def latest_due_tick(expression: str, time_zone: str, first_ns: int, now_ns: int,
                    keep: int = 1) -> tuple[int, int]:
    """(the tick to run, ticks skipped before it), starting from the due tick ``first_ns``: the latest
    cron tick <= now, or with ``keep`` > 1 (coalesce = off) the oldest of the ``keep`` latest ones."""
    due: deque[int] = deque([first_ns], maxlen=keep)
    seen = 1
    tick = first_ns
    for _ in range(MAX_COALESCE_STEPS):
        tick = schedule.next_cron_tick(expression, time_zone, tick)
        if tick > now_ns:
            break
        due.append(tick)
        seen += 1
    return due[0], seen - len(due)


async def plan_cron(conn: psycopg.AsyncConnection[Any]) -> int:
    """Give every due or unplanned cron job its tick to run (missed ones coalesced); returns skipped count."""
    skipped_total = 0
    async with conn.transaction():
        cur = await conn.execute(DUE_CRON)
        for job_id, version, planned, anchor, expression, zone, now_ns, coalesce, jitter in await cur.fetchall():
            try:
                tick = planned if planned is not None else schedule.next_cron_tick(expression, zone, anchor)
                status, error = "scheduled", None
                if tick <= now_ns:
                    # a later tick replaces the planned one only once it is due whatever its offset
                    tick, skipped = latest_due_tick(expression, zone, tick, now_ns - jitter,
                                                    1 if coalesce else MAX_MISSED_TICKS)
                    skipped_total += skipped
                else:
                    skipped = 0
            except ScheduleError as exc:
                tick, skipped, status = planned or anchor, 0, "failed"
                error = Jsonb({"error": "PL_JOB_ATTEMPT_FAILED", "kind": "invalid_schedule",
                                                  "category": "data", "message": str(exc)})
            await conn.execute(STORE_PLAN, {"tick": tick, "due": tick if status == "scheduled" else None,
                                            "skipped": skipped, "status": status, "error": error,
                                            "job": job_id, "version": version})
    return skipped_total
