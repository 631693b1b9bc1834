"""When an engine looks for work, what a look may take, and starting what it found in free slots (an
engine's dispatcher, composed by engine/runner.py), with the policy itself in radixjobs.fairness.

Two looks, each one round trip on the scheduler's pool:
- ``find_ticks`` (engine/ticks.py): a batch of due ticks, and whether the lease path has work; writes no
  tuple, so a tick found is not held: the queue of found ticks is only this node's plan, replaced at the
  next find, and a tick's own transaction is its fence (radix.start_tick). Its ticks start alone (the tick
  runner) or, from a backlog, in batches (the batch runner).
- ``claim_due``: a conditional update decided by the database clock (radix.claim_due), for the lease path
  (non-atomic and cron jobs, requests, resumed claims); cron ticks are computed here (Python), coalesced to
  the latest due one, and stored (``plan_cron``) before the claim that takes them, which deals them with
  every other due tick. Its claims start on the lease runner.
- ``look`` of another source (engine/work.py, the CRON_TABLE documents): its items start in free slots
  under the same cap per principal.

Invariants:
- Every attempt started holds one slot of InFlight.slots (a reservation within its parent's: the cluster's
  or the node's), reserved before its claim or start and released when its task is done; a claim never
  asks for more ticks than slots were reserved, and gives back the slots of ticks it did not get.
- Long attempts (a job timeout above ``Reserve.long_ms``) running here, and long claims made and not yet
  started, never exceed ``Reserve.long_cap``: every claim is told how many more it may take (``max_long``),
  the queue of found ticks starts no more, and the next-due probe leaves long ticks out while none may
  start, so a node whose long slots are full does not wake for them.
- A tick not queued is looked for at its time, however long the queued ones wait (a cap, or long slots):
  the earliest due one as of the last look, when that was beyond the finder's horizon, and the next tick of
  each job whose attempt ended here (InFlight.ahead).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from radixjobs.engine.attempt import Claim
from radixjobs.engine.batches import BatchRunner
from radixjobs.engine.definitions import (
    CLAIM,
    CLAIM_COLUMNS,
    CLAIM_DEADLINE,
    CLAIM_PRINCIPAL,
    LOAD_DEFINITIONS,
    DefinitionCache,
    definition_from_row,
)
from radixjobs.engine.inflight import InFlight
from radixjobs.engine.lease_runner import LeaseRunner
from radixjobs.engine.planning import CRON_DUE, CronPlanner
from radixjobs.engine.principals import PrincipalPools
from radixjobs.engine.tick_runner import TickRunner
from radixjobs.engine.ticks import FIND_AHEAD_S, FIND_BATCH, FIND_TICKS, HORIZON_MS, Tick, TickQueue, wake_in
from radixjobs.engine.work import Work, WorkSource
from radixjobs.fairness import Reserve, Served

if TYPE_CHECKING:
    from radixjobs.engine.observer import Observer

log = logging.getLogger("radixjobs.engine")

CLAIM_BATCH = 64
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


class Dispatcher:
    """Looks for due work and starts it: lone ticks and batches from the queue of found ticks, claims of
    the lease path; each in a slot, as a task of InFlight."""

    def __init__(self, pool: AsyncConnectionPool[Any], node_id: str, *, lease_s: int, max_per_principal: int,
                 reserve: Reserve, served: Served, queue: TickQueue, inflight: InFlight,
                 definitions: DefinitionCache, principals: PrincipalPools, counters: Counter[str],
                 tick_runner: TickRunner, batch_runner: BatchRunner, lease_runner: LeaseRunner,
                 work: WorkSource | None = None, jobs: bool = True):
        self._pool = pool
        self.node_id = node_id
        self.lease_s = lease_s
        self.max_per_principal = max_per_principal
        self.reserve = reserve  # docs/security.md "Fair claims"
        self._served = served  # the tie-break among principals with as few running (radixjobs.fairness)
        self._queue = queue  # ticks found, not started (engine/ticks.py)
        self._inflight = inflight
        self._definitions = definitions
        self._principals = principals
        self.counters = counters
        self._tick_runner = tick_runner
        self._batch_runner = batch_runner
        self._lease_runner = lease_runner
        self._work = work  # attempts of another target kind (engine/work.py): the CRON_TABLE documents
        self._work_waited = False  # the work was due and found no free slot: it is offered the next ones first
        self.jobs = jobs  # False: the jobs are left to other engines (``radixjobs docs run``)
        self.observer: Observer | None = None  # set by the engine (radixjobs.observe)
        self.stopping = False
        self.claim_filled = False  # the last dispatch claimed all it asked for: more may be due at once
        self._due: tuple[float, float] | None = None  # (seconds until due, monotonic time measured)
        self._lease_due = True  # the lease path may have work (radix.lease_work_due): claim_due's turn
        self._cron_due = True  # cron ticks may await planning: the next claim plans them first
        self._cron = CronPlanner()  # remembers the plans that stand, so a due backlog is planned once
        self._find_now = False  # a notification came: find ticks even if some are queued

    # -- the verbs -------------------------------------------------------------------------------------
    async def dispatch_due(self) -> int:
        """Start due work in the free slots; returns how many attempts started. Ticks come from the queue,
        found again when it is empty or stale (one round trip, which also says whether the lease path has
        work); then, when it has, claim_due for the lease path; then the work of the other source when it
        is due (engine/work.py). Ticks are found again sooner when one due was not queued (_unqueued_due).
        Due work that found no free slot is offered the next free ones before ticks, so a backlog of ticks
        that takes every slot as it frees cannot starve it (nor it the ticks: they take turns)."""
        self.claim_filled = False
        if self.stopping:
            return 0
        slots, work = self._inflight.slots, self._work
        work_due = work is not None and self._work_due()
        started, offered = 0, False
        if work is not None and work_due and self._work_waited and slots.free > 0:
            started, offered = await self._dispatch_work(work), True
        if self.jobs:
            started += await self._dispatch_jobs()
        if work is not None and work_due and not offered and slots.free > 0:
            started, offered = started + await self._dispatch_work(work), True
        self._work_waited = work_due and not offered
        return started

    async def _dispatch_jobs(self) -> int:
        # a queue past its time is found again before it deals: a principal whose tick came due since the
        # last find competes for the free slots (those may have been busy for long: a turnover)
        stale = self._queue.stale(time.monotonic(), self._inflight.tick_connections, self.max_per_principal)
        started = 0 if stale else self._start_ticks()
        now = time.monotonic()
        slots = self._inflight.slots
        if slots.free > 0 and (stale or self._find_now or not len(self._queue) or self._unqueued_due(now)):
            if started:
                await asyncio.sleep(0)  # the ticks just started send their queries before the find's
            await self._find_ticks()
            started += self._start_ticks()
        if self._lease_due and slots.free > 0:
            started += await self._dispatch_claims()
        self.claim_filled = self.claim_filled or (self._queue.full and not len(self._queue))
        return started

    async def claim_due(self, limit: int) -> list[Claim]:
        """Claim up to ``limit`` due ticks. One round trip (the claim, then the next due time and whether
        cron ticks await planning, pipelined) unless cron ticks need planning: when the last claim said
        so, they are planned first (missed ones coalesced) and this claim takes them with the rest, in
        one deal, so a backlog that fills every claim never leaves them waiting; when this claim finds
        some and had room left, they are planned and claimed at once. A cron tick never runs stale. No
        more of them are long than may start here (the lease tokens of those are in long_claims)."""
        began = time.monotonic()
        long_limit = self._long_limit(limit)
        async with self._pool.connection() as conn:
            with_cron = self._cron_due  # as of the last claim: planned first, so they compete in this one
            if with_cron:
                self.counters["coalesced_ticks"] += await self._cron.plan_cron(conn)
            async with conn.pipeline():
                claim_cur = await conn.execute(CLAIM, self._claim_params(limit, with_cron, long_limit))
                after_cur = await conn.execute(AFTER_CLAIM, self._next_due_params())
            rows = await claim_cur.fetchall()
            after = await after_cur.fetchone()
            self._cron_due = bool(after and after[1])
            if self._cron_due and len(rows) < limit:
                self.counters["coalesced_ticks"] += await self._cron.plan_cron(conn)
                if long_limit is not None:
                    long_limit -= sum(self.reserve.is_long(int(row[CLAIM_DEADLINE])) for row in rows)
                cur = await conn.execute(CLAIM, self._claim_params(limit - len(rows), True, long_limit))
                rows += await cur.fetchall()
                after_cur = await conn.execute(NEXT_DUE, self._next_due_params())
                after = await after_cur.fetchone()
                self._cron_due = False
            self._note_due(after)
        if self.observer is not None:
            self.observer.claimed(time.monotonic() - began)
        claims = []
        for row in rows:
            self._definitions.remember_claimed(row)
            claim = Claim(*row[:CLAIM_COLUMNS])
            claims.append(claim)
            self._served.note(int(row[CLAIM_PRINCIPAL]))
            if self.reserve.is_long(int(row[CLAIM_DEADLINE])):
                self._inflight.long_claims.add(claim.lease_token)
        for claim in claims:
            self.counters["claims"] += 1
            self.counters["coalesced_ticks"] += claim.coalesced
            if claim.resumed:
                self.counters["lease_recoveries"] += 1
        return claims

    async def next_due_in(self) -> float | None:
        """Seconds until the earliest due tick (0 when one is due now), or None when nothing is planned."""
        if not self.jobs:
            return self.due_in()
        async with self._pool.connection() as conn:
            cur = await conn.execute(NEXT_DUE, self._next_due_params())
            self._note_due(await cur.fetchone())
        return self.due_in()

    def poke(self) -> None:
        """A notification came (a job or a document made or changed): the next dispatch finds ticks afresh,
        and the other source looks."""
        self._find_now = True
        if self._work is not None:
            self._work.poke()

    # -- starting attempts -----------------------------------------------------------------------------
    async def _dispatch_claims(self) -> int:
        """The lease path: claim as many due ticks as there are free slots and start them."""
        slots = self._inflight.slots
        granted = slots.reserve(min(slots.free, CLAIM_BATCH))
        if granted == 0:
            return 0
        try:
            claims = await self.claim_due(granted)
        except BaseException:
            slots.release(granted)
            raise
        slots.release(granted - len(claims))
        self.claim_filled = len(claims) == granted
        self._lease_due = self.claim_filled
        inflight = self._inflight
        for claim in claims:
            inflight.leases.add(claim.lease_token)
            long = claim.lease_token in inflight.long_claims
            inflight.long_claims.discard(claim.lease_token)
            self._spawn(self._lease_runner.run_claim(claim), long=long)
        return len(claims)

    def _start_ticks(self) -> int:
        """Start the queued ticks that are due, as far as free slots, the principals' caps and the slots long
        attempts may hold allow; due ticks left over then join a batch of their principal's when they can
        (engine/batches.py)."""
        inflight = self._inflight
        free = inflight.slots.free
        if free <= 0 or not len(self._queue):
            return 0
        now = time.monotonic()
        leads = self._queue.take(free, inflight.tick_connections, self.max_per_principal, now, self._long_free())
        started = 0
        leads_left = Counter(lead.principal for lead in leads)  # a principal's backlog is dealt among them
        for lead in leads:
            inflight.slots.reserve(1)
            inflight.tick_connections[lead.principal] += 1
            batch = self._batch_runner.form(lead, now, leads_left)
            for tick in [item.tick for item in batch] or [lead]:
                inflight.ticks[tick.job_id] = tick
                self.counters["claims"] += 1
                self.counters["coalesced_ticks"] += tick.coalesced
                started += 1
            attempt = self._batch_runner.run(batch) if batch else self._tick_runner.run(lead)
            self._spawn(attempt, long=self._queue.is_long(lead))
        return started

    async def _dispatch_work(self, work: WorkSource) -> int:
        """The other source's items: as many as there are free slots, under the same cap per principal
        as ticks (InFlight.tick_connections counts both)."""
        inflight = self._inflight
        granted = inflight.slots.reserve(inflight.slots.free)
        try:
            items = await work.look(granted, inflight.tick_connections, self.max_per_principal)
        except BaseException:
            inflight.slots.release(granted)
            raise
        inflight.slots.release(granted - len(items))
        for item in items:
            inflight.tick_connections[item.principal] += 1
            self._served.note(item.principal)
            self._spawn(self._run_work(item))
        return len(items)

    async def _run_work(self, item: Work) -> None:
        try:
            await item.run()
        finally:
            self._inflight.principal_done(item.principal)

    def _work_due(self) -> bool:
        assert self._work is not None
        due = self._work.due_in()
        return due is not None and due <= 0

    def _spawn(self, attempt: Awaitable[None], *, long: bool = False) -> None:
        """Run an attempt (a claim, a tick or a batch) in its slot; ``long``: one long attempts may hold."""
        task = asyncio.ensure_future(attempt)
        self._inflight.tasks.add(task)
        if long:
            self._inflight.long_tasks.add(task)
        task.add_done_callback(self._attempt_done)

    def _attempt_done(self, task: asyncio.Task[None]) -> None:
        inflight = self._inflight
        inflight.tasks.discard(task)
        inflight.long_tasks.discard(task)
        inflight.slots.release()
        inflight.finished.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("attempt task failed node=%s error=%r", self.node_id, task.exception())

    async def _find_ticks(self) -> None:
        """Find due ticks (and those due within HORIZON_MS) in place of the queued ones; one round trip,
        plus one to load the definitions this engine lacks."""
        self._find_now = False
        began = time.monotonic()
        inflight = self._inflight
        if inflight.ahead is not None and inflight.ahead <= began + HORIZON_MS / 1000:
            inflight.ahead = None  # this find sees it
        async with self._pool.connection() as conn:
            async with conn.pipeline():
                cur = await conn.execute(FIND_TICKS, (self.node_id, FIND_BATCH, HORIZON_MS, list(inflight.ticks),
                                                      self._principals.backend_pids(), self._served.oldest_first()))
                after_cur = await conn.execute(AFTER_FIND, (*self._next_due_params(), self.node_id))
            now = time.monotonic()
            after = await after_cur.fetchone()
            # due_in_ms is as of the find's end, before the second query ran: never early, and not that late
            waited = max(0.0, after[2].total_seconds()) if after else 0.0
            ticks = [Tick.from_row(row, now - waited) for row in await cur.fetchall()]
            missing = {t.job_id for t in ticks if self._definitions.get((t.job_id, t.definition_version)) is None}
            if missing:
                async with conn.cursor(row_factory=dict_row) as dcur:
                    await dcur.execute(LOAD_DEFINITIONS, (list(missing),))
                    for row in await dcur.fetchall():
                        self._definitions.put(definition_from_row(row))
        self._note_due(after)
        self._lease_due = self._lease_due or bool(after and after[1])
        self._queue.replace(ticks, FIND_BATCH, now)
        if self.observer is not None:
            self.observer.claimed(time.monotonic() - began)

    # -- the timing and the limits (no I/O) ------------------------------------------------------------
    @property
    def has_free_slot(self) -> bool:
        """Has this engine a slot of its own free? (An attempt ending here sets InFlight.finished otherwise.)
        Its own, not its parent's: a parent's slot freed by another engine sets nothing here, so while only
        the parent is full the caller keeps to its short pauses rather than sleep until one of its own ends."""
        return not self.stopping and self._inflight.slots.own_free > 0

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
        waits = self._job_waits(now) if self.jobs else []
        if self._work is not None:
            work_due = self._work.due_in()
            if work_due is not None:
                waits.append(max(0.0, work_due))
        return min(waits) if waits else None

    def _job_waits(self, now: float) -> list[float]:
        waits: list[float] = []
        if len(self._queue):
            queued = self._queue.next_due_in(self._inflight.tick_connections, self.max_per_principal, now,
                                             self._long_free())
            unfound = self._unfound_in(now)
            waits = [wait for wait in (queued, None if unfound is None else wake_in(unfound)) if wait is not None]
        else:
            if self._due is not None:
                seconds, measured = self._due
                waits.append(wake_in(max(0.0, seconds - (now - measured))))
            if self._inflight.ahead is not None:
                waits.append(wake_in(max(0.0, self._inflight.ahead - now)))
        return waits

    def _unfound_in(self, now: float) -> float | None:
        """Seconds until the earliest tick not queued, however long the queued ones wait (a cap, or long
        slots): the earliest one this engine could start as of the last find or claim, when that was beyond
        the finder's horizon then, or the next tick of a job whose attempt ended here since (InFlight.ahead);
        None when there is none."""
        ahead = self._inflight.ahead
        dues = [] if ahead is None else [ahead - now]
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
        return self.reserve.long_free(self._inflight.long_running)
