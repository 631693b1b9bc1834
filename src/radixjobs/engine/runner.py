"""The engine for one database, composed of its parts around one in-flight state (engine/inflight.py): find
due ticks and run each in one transaction as its principal; claim the rest (the lease path), run each as its
principal, finalise; repeat.

The parts, each its own class, and where each verb lives (each verb one database round trip, with its
invariant in its module):
- the dispatcher (engine/dispatch.py): when to look and what a look may take (the caps, the slots kept
  from long attempts, the served tie-break), ``find_ticks``, ``claim_due`` and ``plan_cron``, and starting
  what they found in free slots;
- the tick runner (engine/tick_runner.py): a lone tick, run and recorded in one transaction; the batch
  runner (engine/batches.py): a batch of ticks, in one transaction;
- the lease runner (engine/lease_runner.py): a claim, run as its principal; ``renew`` (engine/leases.py):
  every lease/3 s, one token-fenced UPDATE extends the leases of the attempts in progress, and a lease found
  gone ends its attempt (an attempt's length is bounded by its timeout, not its lease);
- the outcome recorder (engine/outcomes.py): ``finish``, a fenced write of an observed outcome that does
  nothing when the lease was lost, and the reading of an in-doubt COMMIT;
- the engine itself (here): the node's registration, the pools, ``release`` (hand back unstarted claims on
  shutdown), and the loops that dispatch and wait.

Invariants: each part's, in its module; the parts share no state but InFlight, the counters, the caches of
definitions and durations, and the queue of found ticks (the dispatcher's, which the batch runner draws
from).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from radixjobs import retry
from radixjobs.db import POOL_OPEN_TIMEOUT_S, abound_lock_waits, scheduler_dsn
from radixjobs.engine.attempt import AttemptRunner, Claim, Pause
from radixjobs.engine.batches import BATCH_MAX, BatchRunner
from radixjobs.engine.definitions import DefinitionCache
from radixjobs.engine.dispatch import Dispatcher
from radixjobs.engine.inflight import InFlight
from radixjobs.engine.lease_runner import LeaseRunner
from radixjobs.engine.leases import DEFAULT_LEASE_S, LeaseKeeper
from radixjobs.engine.nodes import default_node_id, listen, register_node
from radixjobs.engine.outcomes import OutcomeRecorder
from radixjobs.engine.principals import PrincipalPools
from radixjobs.engine.slots import Slots
from radixjobs.engine.tick_runner import TickRunner
from radixjobs.engine.ticks import Durations, TickQueue
from radixjobs.engine.work import WorkContext, WorkSource
from radixjobs.fairness import LONG_ATTEMPT_S, Reserve, Served, principal_cap

if TYPE_CHECKING:
    import uuid

    from radixjobs.engine.observer import Observer

log = logging.getLogger("radixjobs.engine")

MAX_DEFINITIONS = 10_000  # cached job definitions (least recently used dropped first) …
MAX_DEFINITION_BYTES = 16 * 1024 * 1024  # … and at most this much of them (JobDefinition.size_bytes)

# The fixed set of counters an engine reports (status and metrics never grow with jobs or errors).
COUNTER_KEYS = ("claims", "batched_ticks", "successes", "retries", "coalesced_ticks", "ticks_refused",
                "lease_recoveries", "leases_lost", "terminations", *(f"failures_{c}" for c in retry.Category))




class Engine:
    """Runs due work of one database. ``async with Engine(dsn) as e: await e.run_due()``."""

    def __init__(self, dsn: str, *, node_id: str | None = None, concurrency: int = 8,
                 grace_s: float = 5.0, pause: Pause | None = None, shared_slots: Slots | None = None,
                 finished: asyncio.Event | None = None, max_per_principal: int | None = None,
                 lease_s: int = DEFAULT_LEASE_S, tick_batch: int = BATCH_MAX, reserved_slots: int | None = None,
                 long_attempt_s: float = LONG_ATTEMPT_S, work: WorkSource | None = None, jobs: bool = True):
        self.dsn = scheduler_dsn(dsn)
        self.node_id = node_id or default_node_id()
        self.concurrency = concurrency
        self.max_per_principal = principal_cap(concurrency, max_per_principal)
        self.reserve = Reserve.of(concurrency, reserved_slots, long_attempt_s)  # docs/security.md "Fair claims"
        self.lease_s = lease_s
        self.tick_batch = tick_batch  # ticks per batch (engine/batches.py); 1: each alone
        self.counters: Counter[str] = Counter(dict.fromkeys(COUNTER_KEYS, 0))
        self.cancel = asyncio.Event()
        # an attempt holds a slot here and, at once, one of ``shared_slots`` (the cluster's or the node's)
        self.inflight = InFlight(Slots(concurrency, parent=shared_slots), finished or asyncio.Event())
        self._pool = AsyncConnectionPool(self.dsn, min_size=1, max_size=4, open=False,
                                         kwargs={"autocommit": True}, name="radix-scheduler",
                                         configure=abound_lock_waits)
        self._control: psycopg.AsyncConnection[Any] | None = None
        self._principals = PrincipalPools(dsn, max_idle=concurrency)
        self._attempts = AttemptRunner(self._terminate, grace_s=grace_s)
        definitions = DefinitionCache(MAX_DEFINITIONS, MAX_DEFINITION_BYTES)
        durations = Durations()  # procedures' last attempts here: only short ones batch
        served = Served()  # the tie-break among principals with as few running (radixjobs.fairness)
        queue = TickQueue(self.reserve, served)  # ticks found, not started (engine/ticks.py)
        pools, attempts, inflight = self._principals, self._attempts, self.inflight
        self._recorder = OutcomeRecorder(self._pool, self.node_id, self.counters, inflight, pools, pause)
        self._lease_runner = LeaseRunner(self._pool, self.node_id, definitions, pools, attempts, self._recorder,
                                         inflight, self.cancel, pause)
        self._tick_runner = TickRunner(self._pool, self.node_id, lease_s, definitions, durations, pools, attempts,
                                       self._recorder, self._lease_runner, inflight, self.cancel, pause)
        self._batch_runner = BatchRunner(self.node_id, tick_batch, queue, definitions, durations, pools, attempts,
                                         self._recorder, self._tick_runner, inflight, self.cancel, pause)
        self._dispatcher = Dispatcher(self._pool, self.node_id, lease_s=lease_s,
                                      max_per_principal=self.max_per_principal, reserve=self.reserve, served=served,
                                      queue=queue, inflight=inflight, definitions=definitions, principals=pools,
                                      counters=self.counters, tick_runner=self._tick_runner,
                                      batch_runner=self._batch_runner, lease_runner=self._lease_runner,
                                      work=work, jobs=jobs)
        self.work = work  # attempts of another target kind (engine/work.py), in this engine's slots
        self._lease_keeper = LeaseKeeper(self._pool, self.node_id, lease_s, self.inflight.held_leases,
                                         self._attempts.lose)

    # -- what callers read and set -----------------------------------------------------------------
    @property
    def finished(self) -> asyncio.Event:
        """Set whenever an attempt ends (a caller's own event, or the engine's)."""
        return self.inflight.finished

    @property
    def observer(self) -> Observer | None:
        """Latency histograms and spans (radixjobs.observe); None: none kept."""
        return self._recorder.observer

    @observer.setter
    def observer(self, observer: Observer | None) -> None:
        self._recorder.observer = observer
        self._dispatcher.observer = observer

    @property
    def last_error(self) -> dict[str, Any] | None:
        """The last failure recorded here, as stored."""
        return self._recorder.last_error

    @property
    def stopping(self) -> bool:
        return self._dispatcher.stopping

    @property
    def claim_filled(self) -> bool:
        """The last dispatch claimed all it asked for: more may be due at once."""
        return self._dispatcher.claim_filled

    @property
    def has_free_slot(self) -> bool:
        """Could this engine start another attempt? (An attempt ending sets ``finished`` otherwise.)"""
        return self._dispatcher.has_free_slot

    @property
    def running(self) -> int:
        return len(self.inflight.tasks)

    # -- the engine's life -------------------------------------------------------------------------
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
        if self.work is not None:
            self.work.bind(WorkContext(self._pool, self._principals, self.node_id, self._watch, self.counters,
                                       self.cancel))

    async def shutdown(self, grace_s: float) -> None:
        """Stop claiming; wait up to ``grace_s`` for running attempts, then cancel them (recorded as
        cancellation, their ticks retried at once by any node); then close."""
        self._dispatcher.stopping = True
        running = self.inflight.tasks
        if running:
            await asyncio.wait(running, timeout=grace_s)
        if running:
            log.warning("cancelling %d running attempt(s) node=%s", len(running), self.node_id)
            self.cancel.set()
        await self.close()

    async def close(self) -> None:
        """Wait for running attempts, hand back unstarted claims, close every connection."""
        self._dispatcher.stopping = True
        if self.inflight.tasks:
            await asyncio.gather(*self.inflight.tasks, return_exceptions=True)
        await self._lease_keeper.stop()
        if self.work is not None:
            await self.work.close()
        try:
            async with self._pool.connection() as conn:
                await conn.execute("SELECT radix.release_claims(%s)", (self.node_id,))
        except psycopg.Error as exc:
            log.warning("release of claims failed node=%s error=%s", self.node_id, exc)
        self._attempts.close()
        await self._principals.close()
        await self._pool.close()
        if self._control is not None:
            await self._control.close()

    async def failed_job_name(self, job_id: uuid.UUID, planned_ns: int, attempt: int, run_kind: str) -> str | None:
        """The job's name when that attempt of that tick is recorded failed (OutcomeRecorder.failed_job_name)."""
        return await self._recorder.failed_job_name(job_id, planned_ns, attempt, run_kind)

    # -- dispatching and waiting (engine/dispatch.py) ----------------------------------------------
    async def claim_due(self, limit: int) -> list[Claim]:
        """Claim up to ``limit`` due ticks (Dispatcher.claim_due)."""
        return await self._dispatcher.claim_due(limit)

    async def dispatch_due(self) -> int:
        """Start due work in the free slots; returns how many attempts started (Dispatcher.dispatch_due)."""
        return await self._dispatcher.dispatch_due()

    async def next_due_in(self) -> float | None:
        """Seconds until the earliest due tick (0 when one is due now), or None when nothing is planned."""
        return await self._dispatcher.next_due_in()

    def due_in(self) -> float | None:
        """Seconds until the next dispatch should run, without a query (Dispatcher.due_in)."""
        return self._dispatcher.due_in()

    def poke(self) -> None:
        """A notification came (a job or a document made or changed): the next dispatch looks afresh."""
        self._dispatcher.poke()

    async def wait_for_work(self, seconds: float) -> None:
        """Sleep until an attempt ends or ``seconds`` pass."""
        self.finished.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.finished.wait(), seconds)

    async def run_due(self) -> int:
        """Run everything due now, then return the number of attempts run."""
        self._dispatcher.poke()  # a look now, whatever the last one planned
        total = 0
        running = self.inflight.tasks
        while True:
            started = await self._dispatcher.dispatch_due()
            total += started
            if not started and not running:
                return total
            if not started:
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)

    async def run_for(self, seconds: float, poll_s: float = 1.0) -> int:
        """Run due work as it comes due for ``seconds``, woken by notifications too; returns the number of
        attempts run."""
        end = time.monotonic() + seconds
        total = 0
        listener = await listen(self.dsn)
        hints = asyncio.create_task(self._poke_on(listener))
        try:
            while time.monotonic() < end and not self.cancel.is_set():
                total += await self._dispatcher.dispatch_due()
                wait = await self._dispatcher.next_due_in()
                # every slot busy: until an attempt ends (``finished``), never a loop of waits of 0
                wait = poll_s if wait is None or not self.has_free_slot else min(wait, poll_s)
                await self.wait_for_work(max(0.0, min(wait, end - time.monotonic())))
        finally:
            hints.cancel()
            await asyncio.gather(hints, return_exceptions=True)
            await listener.close()
        if self.inflight.tasks:
            await asyncio.wait(self.inflight.tasks)
        return total

    def _watch(self, conn: psycopg.AsyncConnection[Any],
               limit_s: float) -> contextlib.AbstractAsyncContextManager[None]:
        """The watchdog for another source's items (engine/work.py): this engine's, with its cancel."""
        return self._attempts.watch(conn, limit_s, self.cancel)

    async def _poke_on(self, listener: psycopg.AsyncConnection[Any]) -> None:
        """A notification pokes the dispatcher and wakes the wait (a lost connection: the poll goes on)."""
        with contextlib.suppress(psycopg.Error):
            async for _ in listener.notifies():
                self.poke()
                self.finished.set()

    async def _terminate(self, pid: int) -> None:
        """End a principal backend from the scheduler's own connection (deadline + grace passed)."""
        self.counters["terminations"] += 1
        async with self._pool.connection() as conn:
            await conn.execute("SELECT pg_catalog.pg_terminate_backend(%s::pg_catalog.int4)", (pid,))
