"""Cron planning: the database cannot evaluate cron expressions, so due cron ticks are planned here.

Invariants:
- A plan is written only under its job's state row lock (``FOR UPDATE SKIP LOCKED``), from the values read
  under it, so two nodes never plan the same job at once; a plan is stored only while the job is still
  scheduled at the version read.
- A cron tick never runs stale: missed ticks are coalesced to the latest due one (or, with coalesce off, the
  oldest of the ``MAX_MISSED_TICKS`` latest), the skipped ones counted; the walk is bounded
  (``MAX_COALESCE_STEPS``). Under WITH (jitter = J) a later tick counts as due only from J after it (its
  offset is below J), so a due tick is never replaced by one that is not.
- A due backlog is planned once. The jobs awaiting planning are read without locks; a planned one whose tick
  is still the one to run (fewer of the cron ticks after it are due than it keeps: one, or
  ``MAX_MISSED_TICKS`` with coalesce off) and whose due time is its tick's is neither locked nor written.
  What is known of the ticks after a plan is remembered by (job, version, tick), for at most
  ``MAX_REMEMBERED`` plans still awaiting a claim, so such a job costs no cron evaluation either.
- An expression that cannot be evaluated fails its own job (``invalid_schedule``), never the planner.
"""

from __future__ import annotations

import uuid
from collections import deque
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from radixjobs import schedule
from radixjobs.errors import ScheduleError

MAX_COALESCE_STEPS = 100_000
MAX_MISSED_TICKS = 1_000  # radix.max_missed_ticks(): with coalesce = off, the missed ticks still run
# Plans whose later ticks are remembered: in a due backlog larger than that, the others' next tick is
# evaluated at each pass, still without a lock or a write.
MAX_REMEMBERED = 16_384

# What is known ahead of a planned tick: (n, the n-th cron tick after it).
Ahead = tuple[int, int]

# Cron jobs awaiting planning, or planned and due (not yet claimed): found through the partial index
# jobs_cron, never by reading every job.
_AWAITING = """j.schedule_kind = 'cron' AND s.status = 'scheduled' AND s.request_kind IS NULL
  AND (s.planned_ns IS NULL OR s.due_ns <= radix.to_ns(clock_timestamp()))"""

# Does a cron job await planning before its tick may be claimed? (The same rows, no locks.)
CRON_DUE = """
EXISTS (SELECT 1 FROM radix.jobs j JOIN radix.radix_system_job_state s USING (job_id)
        WHERE """ + _AWAITING + """)
"""

# The rows a planning pass looks at, without locks; with the jitter offset of the planned tick (its due time
# is the tick plus it, as STORE_PLAN writes).
CRON_CANDIDATES = """
SELECT s.job_id, s.definition_version, s.planned_ns, s.anchor_ns, s.due_ns,
       radix._jitter_ns(s.job_id, s.planned_ns, j.jitter_ns), j.cron_expression, j.cron_time_zone,
       radix.to_ns(clock_timestamp()) AS now_ns, j.coalesce_ticks, coalesce(j.jitter_ns, 0)
FROM radix.jobs j JOIN radix.radix_system_job_state s USING (job_id)
WHERE """ + _AWAITING + """
"""

# The ones whose plan changes, locked and read again under the lock.
DUE_CRON = CRON_CANDIDATES + """  AND s.job_id = ANY (%(jobs)s::uuid[])
FOR UPDATE OF s SKIP LOCKED
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


def ticks_kept(coalesce: bool) -> int:
    """How many of the latest due ticks a late job keeps: the one to run is the oldest of them."""
    return 1 if coalesce else MAX_MISSED_TICKS


def latest_due_tick(expression: str, time_zone: str, first_ns: int, now_ns: int,
                    keep: int = 1) -> tuple[int, int, Ahead | None]:
    """(the tick to run, ticks skipped before it, what is known ahead of it), starting from the due tick
    ``first_ns``: the latest cron tick <= now, or with ``keep`` > 1 (coalesce = off) the oldest of the
    ``keep`` latest ones. Ahead: the first tick after now and its place after the tick to run (None when the
    walk ended before it)."""
    due: deque[int] = deque([first_ns], maxlen=keep)
    seen = 1
    tick = first_ns
    for _ in range(MAX_COALESCE_STEPS):
        tick = schedule.next_cron_tick(expression, time_zone, tick)
        if tick > now_ns:
            return due[0], seen - len(due), (len(due), tick)
        due.append(tick)
        seen += 1
    return due[0], seen - len(due), None


def plan_tick(expression: str, time_zone: str, planned_ns: int | None, anchor_ns: int, now_ns: int,
              jitter_ns: int, keep: int) -> tuple[int, int, Ahead | None]:
    """A job's plan at ``now_ns`` (as latest_due_tick): its planned tick or, unplanned, the first after its
    anchor; when that is due, the latest due one (a later tick due only from ``jitter_ns`` after it)."""
    tick = planned_ns if planned_ns is not None else schedule.next_cron_tick(expression, time_zone, anchor_ns)
    if tick > now_ns:
        return tick, 0, None
    return latest_due_tick(expression, time_zone, tick, now_ns - jitter_ns, keep)


def plan_stands(expression: str, time_zone: str, planned_ns: int, horizon_ns: int, keep: int,
                ahead: Ahead | None) -> tuple[bool, Ahead]:
    """Is the due tick ``planned_ns`` still the one to run at ``horizon_ns`` (fewer than ``keep`` of the
    cron ticks after it are <= the horizon)? Starts from what was known ahead of it, and returns what is
    known now; evaluates the expression only for ticks the horizon has reached, at most ``keep``."""
    count, tick = ahead if ahead is not None and ahead[0] <= keep else (
        1, schedule.next_cron_tick(expression, time_zone, planned_ns))
    while tick <= horizon_ns and count < keep:
        tick = schedule.next_cron_tick(expression, time_zone, tick)
        count += 1
    return tick > horizon_ns, (count, tick)


class CronPlanner:
    """Plans due cron ticks (one per engine), remembering what it learnt of the ticks after each plan."""

    def __init__(self, size: int = MAX_REMEMBERED):
        self.size = size
        self._ahead: dict[tuple[uuid.UUID, int, int], Ahead] = {}

    async def plan_cron(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """Give every cron job whose plan changes (unplanned, or a later tick due) its tick to run (missed ones
        coalesced); returns how many ticks were skipped. A plan that stands is neither locked nor written."""
        cur = await conn.execute(CRON_CANDIDATES)
        stale = self._stale(await cur.fetchall())
        return await self._store(conn, stale) if stale else 0

    def _stale(self, rows: list[tuple[Any, ...]]) -> list[uuid.UUID]:
        """The candidates whose plan changes. What is known ahead of the others is kept, and only theirs: a
        plan claimed or replaced since is forgotten."""
        known: dict[tuple[uuid.UUID, int, int], Ahead] = {}
        stale = []
        for job_id, version, planned, _anchor, due, offset, expression, zone, now_ns, coalesce, jitter in rows:
            if planned is None or due != planned + offset:
                stale.append(job_id)
                continue
            key = (job_id, version, planned)
            try:
                stands, ahead = plan_stands(expression, zone, planned, now_ns - jitter, ticks_kept(coalesce),
                                            self._ahead.get(key))
            except ScheduleError:
                stale.append(job_id)  # fails its job, under the lock
                continue
            if not stands:
                stale.append(job_id)
            elif len(known) < self.size:
                known[key] = ahead
        self._ahead = known
        return stale

    async def _store(self, conn: psycopg.AsyncConnection[Any], jobs: list[uuid.UUID]) -> int:
        """Plan ``jobs`` again under their row locks (those another node or a claim holds are left to it);
        writes only the plans that change."""
        skipped_total = 0
        plans = []
        async with conn.transaction():
            cur = await conn.execute(DUE_CRON, {"jobs": jobs})
            for job_id, version, planned, anchor, due, offset, expression, zone, now_ns, coalesce, jitter in (
                    await cur.fetchall()):
                try:
                    tick, skipped, ahead = plan_tick(expression, zone, planned, anchor, now_ns, jitter,
                                                     ticks_kept(coalesce))
                except ScheduleError as exc:
                    plans.append({"tick": planned or anchor, "due": None, "skipped": 0, "status": "failed",
                                  "error": Jsonb({"error": "PL_JOB_ATTEMPT_FAILED", "kind": "invalid_schedule",
                                                  "category": "data", "message": str(exc)}),
                                  "job": job_id, "version": version})
                    continue
                if ahead is not None and len(self._ahead) < self.size:
                    self._ahead[(job_id, version, tick)] = ahead
                if tick == planned and due == planned + offset:
                    continue  # the plan stands (coalesce off, fewer than its kept ticks due)
                skipped_total += skipped
                plans.append({"tick": tick, "due": tick, "skipped": skipped, "status": "scheduled", "error": None,
                              "job": job_id, "version": version})
            if plans:
                async with conn.cursor() as store:
                    await store.executemany(STORE_PLAN, plans)
        return skipped_total
