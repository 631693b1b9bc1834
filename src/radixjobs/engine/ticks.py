"""The one-transaction tick (sql/routines/tick.sql): found without a claim, run and recorded in one
transaction on the principal's connection.

Invariants:
- The finder (radix.find_ticks, on the scheduler's own connection) writes no row: a tick found is not a
  claim. It may be found by two nodes; the tick lock that radix.start_tick takes lets one run it, and the
  other's query ends at once with RXT01 (nothing happened, nothing is recorded).
- A found tick is queued here until a slot is free, its principal is under its cap, its time has come
  (ticks due within ``HORIZON_MS`` are found ahead and started at their due time) and, for a long tick (its
  job's timeout above the engine's threshold), a slot long attempts may hold is free: ``TickQueue``. A queued
  tick is not in progress anywhere: the queue is only this node's plan, and a tick found stale when it
  starts (ALTER JOB, another node ran it) ends with RXT01 like one run elsewhere.
- The query text carries no token, only its MAC for the backend (engine/attempt.py, ``attempt_mac``), and
  the node id hex-encoded: nothing in it is a quoted value a principal's settings could reinterpret.
- A tick that does not commit leaves the state untouched; the engine then records it as a lease of that
  very tick (radix.claim_tick) and finishes it on the lease path, or publishes a long one as a lease while
  it runs (``PUBLISH_AFTER_S``), so the operator sees it running and ALTER JOB can fence it.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from radixjobs.engine.attempt import Claim, attempt_mac
from radixjobs.engine.principals import clean_statement
from radixjobs.fairness import Reserve, Served

# Ticks found per round trip: ahead of the free slots, so a backlog is not found one tick at a time, and
# enough for every slot's batch (a principal's due ticks are dealt evenly among its batches: engine/batches.py).
FIND_BATCH = 256
# Ticks due within this many milliseconds are found ahead and started at their due time.
HORIZON_MS = 50
# With nothing queued, a node wakes this long before the next due tick to find it (within HORIZON_MS, so
# it is found): the tick then starts at its due time, the find's round trip spent before it, not after.
FIND_AHEAD_S = 0.02
# Found ticks older than this are found again (their order among principals may have changed).
QUEUE_TTL_S = 0.5
# A due tick held back only by its principal's attempts on other nodes is looked at again this soon: those
# counts are as of the find (a node that died frees its share within client_connection_check_interval).
CAPPED_ELSEWHERE_RECHECK_S = 0.1
# A tick still running after this long is published as a lease (visible, renewed, fenced).
PUBLISH_AFTER_S = 1.0
# Only procedures whose last attempt here took at most this long run in batches (engine/batches.py).
BATCH_TICK_MS = 10.0
# ... and a batch holds no more of them than take this long at the procedure's last duration: a batch
# hides its ticks' effects and holds their locks until its COMMIT.
BATCH_BUDGET_MS = 100.0
# Procedures whose last duration is remembered (least recently noted forgotten first).
MAX_DURATIONS = 10_000


FIND_TICKS = ("SELECT * FROM radix.find_ticks(%s::pg_catalog.text, %s::pg_catalog.int4, %s::pg_catalog.int4, "
              "%s::pg_catalog.uuid[], %s::pg_catalog.int4[], %s::pg_catalog.oid[])")
CLAIM_TICK = ("SELECT * FROM radix.claim_tick(%s::pg_catalog.text, %s::pg_catalog.uuid, %s::pg_catalog.int8, "
              "%s::pg_catalog.uuid, %s::pg_catalog.int4, %s::pg_catalog.bool, %s::pg_catalog.timestamptz)")
RECORD_LOST_TICK = ("SELECT radix.record_lost_tick(%s::pg_catalog.text, %s::pg_catalog.uuid, %s::pg_catalog.int8, "
                    "%s::pg_catalog.int4, %s::pg_catalog.timestamptz, %s::pg_catalog.timestamptz, %s::pg_catalog.text)")

# Every value is a quoted literal of digits, hex or a UUID with an explicit cast (as engine/attempt.py), the
# CALL a dollar-quoted constant. The timeout is set by a statement of its own: it bounds the statements after it.
TIMEOUT = "SELECT pg_catalog.set_config('statement_timeout', '{ms}'::pg_catalog.text, true); "
RUN_TICK = ("SELECT r.failed_at, r.error_sqlstate, r.error_message FROM radix.run_tick('{job}'::pg_catalog.uuid, "
            "'{planned}'::pg_catalog.int8, '{attempt}'::pg_catalog.int4, '{mac}'::pg_catalog.text, "
            "{call}::pg_catalog.text, {next}::pg_catalog.int8, '{node}'::pg_catalog.text) r; ")


@dataclass(frozen=True)
class Tick:
    """One tick as radix.find_ticks returned it; ``due_at`` on this process's monotonic clock."""

    job_id: uuid.UUID
    definition_version: int
    planned_ns: int
    attempt: int
    coalesced: int
    anchor_ns: int
    due_at: float
    token: uuid.UUID
    principal: int
    elsewhere: int
    deadline_ms: int  # the job's timeout as found: a long tick runs only in a slot long attempts may hold

    @classmethod
    def from_row(cls, row: tuple[Any, ...], now: float) -> Tick:
        job_id, version, planned, attempt, coalesced, anchor, due_in_ms, token, principal, elsewhere, deadline = row
        return cls(job_id, int(version), int(planned), int(attempt), int(coalesced), int(anchor),
                   now + float(due_in_ms) / 1000, token, int(principal), int(elsewhere), int(deadline))


def tick_claim(tick: Tick) -> Claim:
    """The tick as the claim it is not (yet): its token stands for the lease token."""
    return Claim(tick.job_id, tick.definition_version, tick.token, tick.planned_ns, tick.attempt,
                 f"{tick.job_id}/{tick.planned_ns}", False, tick.coalesced, tick.anchor_ns)


def tick_query(call: str, tick: Tick, deadline_ms: int, next_planned_ns: int | None, session_key: bytes,
               node_hex: str) -> bytes:
    """The tick as one simple query: BEGIN, its timeout, radix.run_tick (its start, the CALL ``call``: the
    job's JobDefinition.tick_call_constant, and its end, in one statement), COMMIT, and then the connection's
    clean, which runs only if the tick committed. run_tick's row is the result attempt.TICK_ROW."""
    following = "NULL" if next_planned_ns is None else f"'{int(next_planned_ns)}'"
    run = RUN_TICK.format(job=tick.job_id, planned=int(tick.planned_ns), attempt=int(tick.attempt),
                          mac=attempt_mac(session_key, tick.token), call=call, next=following, node=node_hex)
    return b"".join((b"BEGIN; ", TIMEOUT.format(ms=int(deadline_ms)).encode(), run.encode(), b"COMMIT; ",
                     clean_statement()))


class TickQueue:
    """Ticks found and not started, per principal in due order. A find replaces them all: the finder
    skips only the ticks running here, so the queued ones come back in its newest order when still due.
    ``reserve``: which ticks are long; ``served``: the engine's tie-break, noted here for each tick taken."""

    def __init__(self, reserve: Reserve | None = None, served: Served | None = None) -> None:
        self._queued: dict[int, collections.deque[Tick]] = {}
        self._elsewhere: dict[int, int] = {}
        self._reserve = reserve
        self._served = served or Served()
        self.found_at = 0.0
        self.full = False  # the last find returned all it was asked for: more may be due

    def __len__(self) -> int:
        return sum(len(q) for q in self._queued.values())

    def is_long(self, tick: Tick) -> bool:
        return self._reserve is not None and self._reserve.is_long(tick.deadline_ms)

    def replace(self, ticks: Iterable[Tick], asked: int, now: float) -> int:
        """Queue a find's ticks in place of the ones queued; returns how many."""
        self._queued.clear()
        self._elsewhere.clear()
        found = 0
        for tick in ticks:
            self._queued.setdefault(tick.principal, collections.deque()).append(tick)
            self._elsewhere[tick.principal] = tick.elsewhere
            found += 1
        self.found_at = now
        self.full = found >= asked
        return found

    def stale(self, now: float, running: dict[int, int], cap: int) -> bool:
        """Should the queued ticks be found again: past QUEUE_TTL_S, or a due one is held back by its
        principal's attempts elsewhere, whose count may have changed since (CAPPED_ELSEWHERE_RECHECK_S)?"""
        age = now - self.found_at
        return age > QUEUE_TTL_S or (age > CAPPED_ELSEWHERE_RECHECK_S and self._capped_elsewhere(running, cap, now))

    def _capped_elsewhere(self, running: dict[int, int], cap: int, now: float) -> bool:
        return cap > 0 and any(q and q[0].due_at <= now and self._elsewhere.get(p, 0) > 0
                               and running.get(p, 0) + self._elsewhere[p] >= cap
                               for p, q in self._queued.items())

    def _first(self, queued: collections.deque[Tick], until: float, long_free: int | None) -> int | None:
        """The index of the principal's first tick due by ``until`` that may start (a long one only while
        ``long_free`` is None or above 0), or None."""
        for index, tick in enumerate(queued):
            if tick.due_at > until:
                return None
            if long_free is None or long_free > 0 or not self.is_long(tick):
                return index
        return None

    def take(self, free: int, running: dict[int, int], cap: int, now: float,
             long_free: int | None = None) -> list[Tick]:
        """Up to ``free`` ticks due by ``now``, dealt one at a time to the principal with the fewest
        attempts running (here and elsewhere), then the one served least recently, oldest due tick first
        among equals, never past ``cap`` (0: no cap), and no more long ticks than ``long_free`` (None: no
        limit): a principal whose due ticks are all long then gets its first short one."""
        taken: list[Tick] = []
        counts = {p: running.get(p, 0) + self._elsewhere.get(p, 0) for p in self._queued}
        while len(taken) < free:
            best: tuple[tuple[int, int, float], int, int] | None = None
            for principal, queued in self._queued.items():
                if cap > 0 and counts[principal] >= cap:
                    continue
                index = self._first(queued, now, long_free)
                if index is None:
                    continue
                key = (counts[principal], self._served.rank(principal), queued[index].due_at)
                if best is None or key < best[0]:
                    best = (key, principal, index)
            if best is None:
                break
            _, principal, index = best
            queued = self._queued[principal]
            tick = queued[index]
            del queued[index]
            taken.append(tick)
            counts[principal] += 1
            self._served.note(principal)
            if long_free is not None and self.is_long(tick):
                long_free -= 1
        for principal in [p for p, q in self._queued.items() if not q]:
            del self._queued[principal]
        return taken

    def due(self, principal: int, now: float) -> int:
        """How many of ``principal``'s queued ticks are due by ``now``."""
        count = 0
        for tick in self._queued.get(principal, ()):
            if tick.due_at > now:
                break
            count += 1
        return count

    def take_like(self, lead: Tick, limit: int, now: float, fits: Callable[[Tick], bool]) -> list[Tick]:
        """Up to ``limit`` more ticks of ``lead``'s principal due by ``now`` that ``fits`` accepts, oldest
        first, for a batch with ``lead`` (engine/batches.py); the others keep their places."""
        queued = self._queued.get(lead.principal)
        if not queued or limit <= 0:
            return []
        taken: list[Tick] = []
        kept: collections.deque[Tick] = collections.deque()
        while queued and len(taken) < limit and queued[0].due_at <= now:
            tick = queued.popleft()
            (taken if fits(tick) else kept).append(tick)
        kept.extend(queued)
        if kept:
            self._queued[lead.principal] = kept
        else:
            del self._queued[lead.principal]
        return taken

    def next_due_in(self, running: dict[int, int], cap: int, now: float,
                    long_free: int | None = None) -> float | None:
        """Seconds until a queued tick could start as far as time, caps and long slots go, or until ticks
        held back by attempts elsewhere are looked at again (None: every one waits for an attempt here to
        end)."""
        dues = []
        for principal, queued in self._queued.items():
            if cap > 0 and running.get(principal, 0) + self._elsewhere.get(principal, 0) >= cap:
                continue
            index = self._first(queued, float("inf"), long_free)
            if index is not None:
                dues.append(queued[index].due_at)
        if self._capped_elsewhere(running, cap, now):
            dues.append(self.found_at + CAPPED_ELSEWHERE_RECHECK_S)
        return max(0.0, min(dues) - now) if dues else None


def wake_in(due_in: float) -> float:
    """Seconds to sleep, with nothing queued, when the next tick is due in ``due_in`` seconds: until
    FIND_AHEAD_S before it, to find it then; once within that, until it is due (never a busy loop)."""
    return due_in - FIND_AHEAD_S if due_in > FIND_AHEAD_S else max(due_in, 0.0)


def node_hex(node_id: str) -> str:
    return node_id.encode("utf-8").hex()


class Durations:
    """How long each procedure's last attempt here took (by signature), to batch only short ones."""

    def __init__(self, limit: int = MAX_DURATIONS) -> None:
        self._ms: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.limit = limit

    def note(self, signature: str, ms: float) -> None:
        self._ms[signature] = ms
        self._ms.move_to_end(signature)
        if len(self._ms) > self.limit:
            self._ms.popitem(last=False)

    def short(self, signature: str) -> bool:
        """Did the procedure's last attempt here take at most BATCH_TICK_MS? (False when none is known.)"""
        ms = self._ms.get(signature)
        return ms is not None and ms <= BATCH_TICK_MS

    def batch_size(self, signature: str) -> int:
        """How many ticks of the procedure fit in BATCH_BUDGET_MS at its last attempt's duration (0: none
        known, or over BATCH_TICK_MS)."""
        ms = self._ms.get(signature)
        if ms is None or ms > BATCH_TICK_MS:
            return 0
        return max(1, int(BATCH_BUDGET_MS / max(ms, 0.001)))
