"""When an engine looks for work and what it may take (engine/runner.py's Engine): its next dispatch, and
the limits it passes to the finder and the claim (no I/O here: the probes' texts and their parameters).

Invariants:
- Long attempts (a job timeout above ``Reserve.long_ms``) running here, and long claims made and not yet
  started, never exceed ``Reserve.long_cap``: every claim is told how many more it may take (``max_long``),
  the queue of found ticks starts no more, and the next-due probe leaves long ticks out while none may
  start, so a node whose long slots are full does not wake for them.
- A tick not queued is looked for at its time, however long the queued ones wait (a cap, or long slots):
  the earliest due one as of the last look, when that was beyond the finder's horizon, and the next tick of
  each job whose attempt ended here (``ahead``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from radixjobs.engine.planning import CRON_DUE
from radixjobs.engine.ticks import FIND_AHEAD_S, HORIZON_MS, TickQueue, wake_in
from radixjobs.fairness import Reserve, Served

# Seconds until the next tick this engine's claim could take: a principal at its cap has nothing due
# until one of its attempts ends, nor a long tick while no long attempt may start here (radix.next_due_in).
NEXT_DUE_IN = "radix.next_due_in(%s::pg_catalog.int4, %s::pg_catalog.int4)"
# After a claim, in its round trip: seconds until the next due tick, and whether cron ticks await planning.
AFTER_CLAIM = "SELECT " + NEXT_DUE_IN + ", " + CRON_DUE
NEXT_DUE = "SELECT " + NEXT_DUE_IN
# After a find of ticks, in its round trip: seconds until the next due tick, and whether the lease path has
# work (radix.lease_work_due, or cron ticks awaiting planning); between two reads of the clock, whose
# difference is how long the found ticks' answer waited for this one's.
AFTER_FIND = ("SELECT " + NEXT_DUE_IN + ", radix.lease_work_due(%s::pg_catalog.text) OR " + CRON_DUE
              + ", pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) t.began "
              "FROM (SELECT pg_catalog.clock_timestamp() AS began OFFSET 0) t")


class DispatchPolicy:
    """What an Engine provides, then its timing and limits."""

    node_id: str
    lease_s: int
    max_per_principal: int
    reserve: Reserve
    ahead: float | None
    _queue: TickQueue
    _ticking_by: dict[int, int]
    _served: Served
    _long: set[asyncio.Task[None]]
    _long_claims: set[uuid.UUID]
    _due: tuple[float, float] | None

    def _claim_params(self, limit: int, with_cron: bool, long_limit: int | None) -> tuple[Any, ...]:
        """definitions.CLAIM's: at most ``long_limit`` long ones (None: no limit), ties by ``_served``."""
        long_ms = None if long_limit is None else self.reserve.long_ms
        return (self.node_id, limit, with_cron, self.max_per_principal, self.lease_s, long_ms, long_limit,
                self._served.oldest_first())

    def _long_limit(self, wanted: int) -> int | None:
        """How many long attempts ``wanted`` more may include (None: all of them)."""
        free = self._long_free()
        return None if free >= wanted else free

    def _next_due_params(self) -> tuple[int, int | None]:
        """radix.next_due_in's: the cap, and the threshold that leaves long ticks out while none may start."""
        return self.max_per_principal, None if self._long_limit(1) is None else self.reserve.long_ms

    def _note_due(self, row: tuple[Any, ...] | None) -> None:
        self._due = None if row is None or row[0] is None else (max(0.0, float(row[0])), time.monotonic())

    def due_in(self) -> float | None:
        """Seconds until the next dispatch should run, without a query: while ticks are queued, until the
        first of them may start (None: all wait for a cap or a long slot), or sooner to find a tick not
        queued (_unfound_in); else until FIND_AHEAD_S before the earliest due tick as of the last find or
        claim (or next_due_in) or of a job whose attempt ended here, so that the find comes before it, and
        once within that, until it is due."""
        now = time.monotonic()
        waits: list[float] = []
        if len(self._queue):
            queued = self._queue.next_due_in(self._ticking_by, self.max_per_principal, now, self._long_free())
            unfound = self._unfound_in(now)
            waits = [wait for wait in (queued, None if unfound is None else wake_in(unfound)) if wait is not None]
        else:
            if self._due is not None:
                seconds, measured = self._due
                waits.append(wake_in(max(0.0, seconds - (now - measured))))
            if self.ahead is not None:
                waits.append(wake_in(max(0.0, self.ahead - now)))
        return min(waits) if waits else None

    def _unfound_in(self, now: float) -> float | None:
        """Seconds until the earliest tick not queued, however long the queued ones wait (a cap, or long
        slots): the earliest one this engine could start as of the last find or claim, when that was beyond
        the finder's horizon then, or the next tick of a job whose attempt ended here since (``ahead``);
        None when there is none."""
        dues = [] if self.ahead is None else [self.ahead - now]
        if self._due is not None and self._due[0] * 1000 > HORIZON_MS:
            seconds, measured = self._due
            dues.append(seconds - (now - measured))
        return max(0.0, min(dues)) if dues else None

    def _unqueued_due(self, now: float) -> bool:
        """Is a tick about due that no find has seen yet (_unfound_in)?"""
        unfound = self._unfound_in(now)
        return unfound is not None and unfound <= FIND_AHEAD_S

    def _long_free(self) -> int:
        """How many more long attempts may start here (claims made and not started count)."""
        return self.reserve.long_free(len(self._long) + len(self._long_claims))
