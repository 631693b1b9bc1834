"""The engine for one database: find due ticks and run each in one transaction as its principal; claim
the rest (the lease path), run each as its principal, finalise; repeat. The attempts themselves are in
engine/execution.py.

Verbs (each one database round trip, each with its invariant):
- ``find_ticks`` (engine/ticks.py): a batch of due ticks, and whether the lease path has work; writes no
  tuple, so a tick found is not held: the queue of found ticks is only this node's plan, replaced at the
  next find, and a tick's own transaction is its fence (radix.begin_tick).
- ``plan_cron``: cron ticks are computed here (Python), coalesced to the latest due one, and stored.
- ``claim_due``: a conditional update decided by the database clock; see radix.claim_due.
- ``finish``: a fenced write of an observed outcome; does nothing when the lease was lost.
- ``release``: hand back unstarted claims on shutdown.
- ``renew`` (leases.py): every lease/3 s, one token-fenced UPDATE extends the leases of the attempts in
  progress; a lease found gone ends its attempt. An attempt's length is bounded by its timeout, not its lease.

When to look and what a look may take (the caps, the slots kept from long attempts, the served tie-break):
engine/dispatch.py, with the policy itself in radixjobs.fairness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from radixjobs import retry
from radixjobs.db import POOL_OPEN_TIMEOUT_S, abound_lock_waits, scheduler_dsn
from radixjobs.engine.attempt import AttemptRunner, Claim
from radixjobs.engine.batches import BATCH_MAX, BatchExecution
from radixjobs.engine.definitions import (
    CLAIM,
    CLAIM_COLUMNS,
    CLAIM_DEADLINE,
    CLAIM_PRINCIPAL,
    LOAD_DEFINITIONS,
    DefinitionCache,
    JobDefinition,
    definition_from_row,
)
from radixjobs.engine.dispatch import AFTER_CLAIM, AFTER_FIND, NEXT_DUE, DispatchPolicy
from radixjobs.engine.execution import Pause
from radixjobs.engine.leases import DEFAULT_LEASE_S, LeaseKeeper
from radixjobs.engine.nodes import default_node_id, register_node
from radixjobs.engine.planning import plan_cron
from radixjobs.engine.principals import PrincipalPools
from radixjobs.engine.slots import Slots
from radixjobs.engine.ticks import (
    FIND_BATCH,
    FIND_TICKS,
    HORIZON_MS,
    Durations,
    Tick,
    TickQueue,
    node_hex,
)
from radixjobs.fairness import LONG_ATTEMPT_S, Reserve, Served, principal_cap

if TYPE_CHECKING:
    from radixjobs.engine.observer import Observer

log = logging.getLogger("radixjobs.engine")

CLAIM_BATCH = 64
MAX_DEFINITIONS = 10_000  # cached job definitions (least recently used dropped first) …
MAX_DEFINITION_BYTES = 16 * 1024 * 1024  # … and at most this much of them (JobDefinition.size_bytes)

# The fixed set of counters an engine reports (status and metrics never grow with jobs or errors).
COUNTER_KEYS = ("claims", "batched_ticks", "successes", "retries", "coalesced_ticks", "ticks_refused",
                "lease_recoveries", "leases_lost", "terminations", *(f"failures_{c}" for c in retry.Category))


class Engine(DispatchPolicy, BatchExecution):
    """Runs due work of one database. ``async with Engine(dsn) as e: await e.run_due()``."""

    def __init__(self, dsn: str, *, node_id: str | None = None, concurrency: int = 8,
                 grace_s: float = 5.0, pause: Pause | None = None, shared_slots: Slots | None = None,
                 finished: asyncio.Event | None = None, max_per_principal: int | None = None,
                 lease_s: int = DEFAULT_LEASE_S, tick_batch: int = BATCH_MAX, reserved_slots: int | None = None,
                 long_attempt_s: float = LONG_ATTEMPT_S):
        self.dsn = scheduler_dsn(dsn)
        self.node_id = node_id or default_node_id()
        self.concurrency = concurrency
        self.max_per_principal = principal_cap(concurrency, max_per_principal)
        self.reserve = Reserve.of(concurrency, reserved_slots, long_attempt_s)  # docs/security.md "Fair claims"
        self._served = Served()  # the tie-break among principals with as few running (radixjobs.fairness)
        self._long: set[asyncio.Task[None]] = set()  # the long attempts running here
        self._long_claims: set[uuid.UUID] = set()  # lease tokens of long claims not yet started
        self.counters: Counter[str] = Counter(dict.fromkeys(COUNTER_KEYS, 0))
        self.last_error: dict[str, Any] | None = None
        self._definitions = DefinitionCache(MAX_DEFINITIONS, MAX_DEFINITION_BYTES)
        self._due: tuple[float, float] | None = None  # (seconds until due, monotonic time measured)
        self.claim_filled = False  # the last dispatch claimed all it asked for: more may be due at once
        self._pool = AsyncConnectionPool(self.dsn, min_size=1, max_size=4, open=False,
                                         kwargs={"autocommit": True}, name="radix-scheduler",
                                         configure=abound_lock_waits)
        self._control: psycopg.AsyncConnection[Any] | None = None
        self._principals = PrincipalPools(dsn, max_idle=concurrency)
        self._runner = AttemptRunner(self._terminate, grace_s=grace_s)
        self._slots = Slots(concurrency)
        self._shared = shared_slots or Slots(concurrency)
        self._running: set[asyncio.Task[None]] = set()
        self.finished = finished or asyncio.Event()  # set whenever an attempt ends (a caller's own, or ours)
        self.stopping = False
        self.cancel = asyncio.Event()
        self._pause = pause
        self.observer: Observer | None = None  # latency histograms and spans (radixjobs.observe)
        self.lease_s = lease_s
        self._leases: set[uuid.UUID] = set()  # tokens of this engine's claims in progress
        self._lease_keeper = LeaseKeeper(self._pool, self.node_id, lease_s, lambda: set(self._leases),
                                         self._lose)
        self._queue = TickQueue(self.reserve, self._served)  # ticks found, not started (engine/ticks.py)
        self._ticking: dict[uuid.UUID, Tick] = {}  # ticks running here, by job
        self._ticking_by: Counter[int] = Counter()  # … and connections running them, by principal (oid)
        self._durations = Durations()  # procedures' last attempts here: only short ones batch
        self.tick_batch = tick_batch  # ticks per batch (engine/batches.py); 1: each alone
        self._lease_due = True  # the lease path may have work (radix.lease_work_due): claim_due's turn
        self._find_now = False  # a notification came: find ticks even if some are queued
        self._node_hex = node_hex(self.node_id)

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Register this node (alive while its control session is), then open the pool. The control
        session is a direct connection, so no server (or, behind a multi-host DSN, no primary yet) fails
        here at once with libpq's reason, rather than after the pool's own retries (docs/failover.md)."""
        self._control = await register_node(self.dsn, self.node_id)
        try:
            await self._pool.open(wait=True, timeout=POOL_OPEN_TIMEOUT_S)
        except BaseException:
            await self._pool.close()  # no-op when its own timeout closed it already
            await self._control.close()
            self._control = None
            raise
        self._lease_keeper.start()

    async def shutdown(self, grace_s: float) -> None:
        """Stop claiming; wait up to ``grace_s`` for running attempts, then cancel them (recorded as
        cancellation, their ticks retried at once by any node); then close."""
        self.stopping = True
        if self._running:
            await asyncio.wait(self._running, timeout=grace_s)
        if self._running:
            log.warning("cancelling %d running attempt(s) node=%s", len(self._running), self.node_id)
            self.cancel.set()
        await self.close()

    async def close(self) -> None:
        """Wait for running attempts, hand back unstarted claims, close every connection."""
        self.stopping = True
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        await self._lease_keeper.stop()
        try:
            async with self._pool.connection() as conn:
                await conn.execute("SELECT radix.release_claims(%s)", (self.node_id,))
        except psycopg.Error as exc:
            log.warning("release of claims failed node=%s error=%s", self.node_id, exc)
        self._runner.close()
        await self._principals.close()
        await self._pool.close()
        if self._control is not None:
            await self._control.close()

    # -- verbs -----------------------------------------------------------------------------------
    async def claim_due(self, limit: int) -> list[Claim]:
        """Claim up to ``limit`` due ticks. One round trip (the claim, then the next due time and whether
        cron ticks await planning, pipelined) unless cron ticks need planning: the first claim leaves
        them alone; they are planned (missed ones coalesced), then claimed. A cron tick never runs stale.
        No more of them are long than may start here (the lease tokens of those are in _long_claims)."""
        began = time.monotonic()
        long_limit = self._long_limit(limit)
        async with self._pool.connection() as conn:
            async with conn.pipeline():
                claim_cur = await conn.execute(CLAIM, self._claim_params(limit, False, long_limit))
                after_cur = await conn.execute(AFTER_CLAIM, self._next_due_params())
            rows = await claim_cur.fetchall()
            after = await after_cur.fetchone()
            if after and after[1] and len(rows) < limit:
                self.counters["coalesced_ticks"] += await plan_cron(conn)
                if long_limit is not None:
                    long_limit -= sum(self.reserve.is_long(int(row[CLAIM_DEADLINE])) for row in rows)
                cur = await conn.execute(CLAIM, self._claim_params(limit - len(rows), True, long_limit))
                rows += await cur.fetchall()
                after_cur = await conn.execute(NEXT_DUE, self._next_due_params())
                after = await after_cur.fetchone()
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
                self._long_claims.add(claim.lease_token)
        for claim in claims:
            self.counters["claims"] += 1
            self.counters["coalesced_ticks"] += claim.coalesced
            if claim.resumed:
                self.counters["lease_recoveries"] += 1
        return claims

    async def next_due_in(self) -> float | None:
        """Seconds until the earliest due tick (0 when one is due now), or None when nothing is planned."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(NEXT_DUE, self._next_due_params())
            self._note_due(await cur.fetchone())
        return self.due_in()

    @property
    def has_free_slot(self) -> bool:
        """Could this engine start another attempt? (An attempt ending sets ``finished`` otherwise.)"""
        return not self.stopping and self._slots.free > 0

    @property
    def running(self) -> int:
        return len(self._running)

    async def dispatch_due(self) -> int:
        """Start due work in the free slots; returns how many attempts started. Ticks come from the queue,
        found again when it is empty or stale (one round trip, which also says whether the lease path has
        work); then, when it has, claim_due for the lease path (non-atomic and cron jobs, requests, resumed
        claims). Ticks are found again sooner when one due was not queued (_unqueued_due)."""
        self.claim_filled = False
        if self.stopping:
            return 0
        # a queue past its time is found again before it deals: a principal whose tick came due since the
        # last find competes for the free slots (those may have been busy for long: a turnover)
        stale = self._queue.stale(time.monotonic(), self._ticking_by, self.max_per_principal)
        started = 0 if stale else self._start_ticks()
        now = time.monotonic()
        if self._free_slots() > 0 and (stale or self._find_now or not len(self._queue) or self._unqueued_due(now)):
            if started:
                await asyncio.sleep(0)  # the ticks just started send their queries before the find's
            await self._find_ticks()
            started += self._start_ticks()
        if self._lease_due and self._free_slots() > 0:
            started += await self._dispatch_claims()
        self.claim_filled = self.claim_filled or (self._queue.full and not len(self._queue))
        return started

    def poke(self) -> None:
        """A notification came (a job made or changed): the next dispatch finds ticks afresh."""
        self._find_now = True

    def _free_slots(self) -> int:
        return min(self._slots.free, self._shared.free)

    async def _dispatch_claims(self) -> int:
        """The lease path: claim as many due ticks as there are free slots and start them."""
        wanted = self._slots.reserve(min(self._slots.free, self._shared.free, CLAIM_BATCH))
        granted = self._shared.reserve(wanted)
        self._slots.release(wanted - granted)
        if granted == 0:
            return 0
        try:
            claims = await self.claim_due(granted)
        except BaseException:
            self._slots.release(granted)
            self._shared.release(granted)
            raise
        self._slots.release(granted - len(claims))
        self._shared.release(granted - len(claims))
        self.claim_filled = len(claims) == granted
        self._lease_due = self.claim_filled
        for claim in claims:
            self._leases.add(claim.lease_token)
            long = claim.lease_token in self._long_claims
            self._long_claims.discard(claim.lease_token)
            self._spawn(self._run_claim(claim), long=long)
        return len(claims)

    def _spawn(self, attempt: Awaitable[None], *, long: bool = False) -> None:
        """Run an attempt (a claim, a tick or a batch) in a slot; ``long``: one long attempts may hold."""
        task = asyncio.ensure_future(attempt)
        self._running.add(task)
        if long:
            self._long.add(task)
        task.add_done_callback(self._attempt_done)

    async def _find_ticks(self) -> None:
        """Find due ticks (and those due within HORIZON_MS) in place of the queued ones; one round trip,
        plus one to load the definitions this engine lacks."""
        self._find_now = False
        began = time.monotonic()
        if self.ahead is not None and self.ahead <= began + HORIZON_MS / 1000:
            self.ahead = None  # this find sees it
        async with self._pool.connection() as conn:
            async with conn.pipeline():
                cur = await conn.execute(FIND_TICKS, (self.node_id, FIND_BATCH, HORIZON_MS, list(self._ticking),
                                                      self._principals.backend_pids()))
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

    def _start_ticks(self) -> int:
        """Start the queued ticks that are due, as far as free slots, the principals' caps and the slots long
        attempts may hold allow; due ticks left over then join a batch of their principal's when they can
        (engine/batches.py)."""
        free = self._free_slots()
        if free <= 0 or not len(self._queue):
            return 0
        now = time.monotonic()
        leads = self._queue.take(free, self._ticking_by, self.max_per_principal, now, self._long_free())
        started = 0
        leads_left = Counter(lead.principal for lead in leads)  # a principal's backlog is dealt among them
        for lead in leads:
            self._slots.reserve(1)
            self._shared.reserve(1)
            self._ticking_by[lead.principal] += 1
            batch = self._batch_with(lead, now, leads_left)
            for tick in [item.tick for item in batch] or [lead]:
                self._ticking[tick.job_id] = tick
                self.counters["claims"] += 1
                self.counters["coalesced_ticks"] += tick.coalesced
                started += 1
            self._spawn(self._run_batch(batch) if batch else self._run_tick(lead), long=self._queue.is_long(lead))
        return started

    def _attempt_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._long.discard(task)
        self._slots.release()
        self._shared.release()
        self.finished.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("attempt task failed node=%s error=%r", self.node_id, task.exception())

    async def wait_for_work(self, seconds: float) -> None:
        """Sleep until an attempt ends or ``seconds`` pass."""
        self.finished.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.finished.wait(), seconds)

    async def run_due(self) -> int:
        """Run everything due now, then return the number of attempts run."""
        total = 0
        while True:
            started = await self.dispatch_due()
            total += started
            if not started and not self._running:
                return total
            if not started:
                await asyncio.wait(self._running, return_when=asyncio.FIRST_COMPLETED)

    async def run_for(self, seconds: float, poll_s: float = 1.0) -> int:
        """Run due work as it comes due for ``seconds``; returns the number of attempts run."""
        end = time.monotonic() + seconds
        total = 0
        while time.monotonic() < end and not self.cancel.is_set():
            total += await self.dispatch_due()
            wait = await self.next_due_in()
            # every slot busy: until an attempt ends (``finished``), never a loop of waits of 0
            wait = poll_s if wait is None or not self.has_free_slot else min(wait, poll_s)
            await self.wait_for_work(max(0.0, min(wait, end - time.monotonic())))
        if self._running:
            await asyncio.wait(self._running)
        return total

    # -- one attempt -----------------------------------------------------------------------------
    async def _definition(self, job_id: uuid.UUID, version: int) -> JobDefinition | None:
        """The definition a claim runs under (cached, bounded: least recently used dropped first); None
        when the job was dropped."""
        job = self._definitions.get((job_id, version))
        if job is None:
            async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(LOAD_DEFINITIONS, ([job_id],))
                row = await cur.fetchone()
            if row is None:
                return None
            # a newer version than the claim's (ALTER since the claim) runs as the claim was made: a
            # re-armed job's lease is gone (begin_attempt refuses), a renamed one's is not
            job = definition_from_row(row)
            self._definitions.put(job)
        return job

    async def _terminate(self, pid: int) -> None:
        """End a principal backend from the scheduler's own connection (deadline + grace passed)."""
        self.counters["terminations"] += 1
        async with self._pool.connection() as conn:
            await conn.execute("SELECT pg_catalog.pg_terminate_backend(%s::pg_catalog.int4)", (pid,))
