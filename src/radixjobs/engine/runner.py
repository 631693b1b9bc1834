"""The engine for one database: claim due ticks, run each as its principal, finalise, repeat.

Verbs (each one database round trip, each with its invariant):
- ``plan_cron``: cron ticks are computed here (Python), coalesced to the latest due one, and stored.
- ``claim_due``: a conditional update decided by the database clock; see radix.claim_due.
- ``finish``: a fenced write of an observed outcome; does nothing when the lease was lost.
- ``release``: hand back unstarted claims on shutdown.
- ``renew`` (leases.py): every lease/3 s, one token-fenced UPDATE extends the leases of the attempts in
  progress; a lease found gone ends its attempt. An attempt's length is bounded by its timeout, not its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from radixjobs import retry
from radixjobs.db import POOL_OPEN_TIMEOUT_S, abound_lock_waits, first_line, scheduler_dsn
from radixjobs.engine.attempt import AttemptRunner, Claim, Outcome
from radixjobs.engine.definitions import (
    CLAIM,
    CLAIM_COLUMNS,
    LOAD_DEFINITIONS,
    DefinitionCache,
    JobDefinition,
    definition_from_row,
)
from radixjobs.engine.leases import DEFAULT_LEASE_S, LeaseKeeper
from radixjobs.engine.nodes import register_node
from radixjobs.engine.planning import CRON_DUE, plan_cron
from radixjobs.engine.principals import PrincipalPools
from radixjobs.engine.slots import Slots
from radixjobs.fairness import principal_cap

if TYPE_CHECKING:
    from radixjobs.observe import Observer

log = logging.getLogger("radixjobs.engine")

CLAIM_BATCH = 64
MAX_DEFINITIONS = 10_000  # cached job definitions (least recently used dropped first) …
MAX_DEFINITION_BYTES = 16 * 1024 * 1024  # … and at most this much of them (JobDefinition.size_bytes)

# Seconds until the next tick this engine's claim could take: a principal at its cap has nothing due
# until one of its attempts ends (radix.next_due_in).
NEXT_DUE_IN = "radix.next_due_in(%s::pg_catalog.int4)"
# After a claim, in its round trip: seconds until the next due tick, and whether cron ticks await planning.
AFTER_CLAIM = "SELECT " + NEXT_DUE_IN + ", " + CRON_DUE
NEXT_DUE = "SELECT " + NEXT_DUE_IN

# The fixed set of counters an engine reports (status and metrics never grow with jobs or errors).
COUNTER_KEYS = ("claims", "successes", "retries", "coalesced_ticks", "lease_recoveries", "leases_lost",
                "terminations", *(f"failures_{c}" for c in retry.Category))

# Test hook: awaited at "claimed" (before the attempt) and "executed" (before finalisation), so crash
# tests can kill the process at exactly those points.
Pause = Callable[[str], Awaitable[None]]


def default_node_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Engine:
    """Runs due work of one database. ``async with Engine(dsn) as e: await e.run_due()``."""

    def __init__(self, dsn: str, *, node_id: str | None = None, concurrency: int = 8,
                 grace_s: float = 5.0, pause: Pause | None = None, shared_slots: Slots | None = None,
                 finished: asyncio.Event | None = None, max_per_principal: int | None = None,
                 lease_s: int = DEFAULT_LEASE_S):
        self.dsn = scheduler_dsn(dsn)
        self.node_id = node_id or default_node_id()
        self.concurrency = concurrency
        self.max_per_principal = principal_cap(concurrency, max_per_principal)
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
        them alone; they are planned (missed ones coalesced), then claimed. A cron tick never runs stale."""
        began = time.monotonic()
        async with self._pool.connection() as conn:
            async with conn.pipeline():
                claim_cur = await conn.execute(CLAIM, (self.node_id, limit, False, self.max_per_principal,
                                                       self.lease_s))
                after_cur = await conn.execute(AFTER_CLAIM, (self.max_per_principal,))
            rows = await claim_cur.fetchall()
            after = await after_cur.fetchone()
            if after and after[1] and len(rows) < limit:
                self.counters["coalesced_ticks"] += await plan_cron(conn)
                cur = await conn.execute(CLAIM, (self.node_id, limit - len(rows), True, self.max_per_principal,
                                                 self.lease_s))
                rows += await cur.fetchall()
                after_cur = await conn.execute(NEXT_DUE, (self.max_per_principal,))
                after = await after_cur.fetchone()
            self._note_due(after)
        if self.observer is not None:
            self.observer.claimed(time.monotonic() - began)
        claims = []
        for row in rows:
            self._definitions.remember_claimed(row)
            claims.append(Claim(*row[:CLAIM_COLUMNS]))
        for claim in claims:
            self.counters["claims"] += 1
            self.counters["coalesced_ticks"] += claim.coalesced
            if claim.resumed:
                self.counters["lease_recoveries"] += 1
        return claims

    async def next_due_in(self) -> float | None:
        """Seconds until the earliest due tick (0 when one is due now), or None when nothing is planned."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(NEXT_DUE, (self.max_per_principal,))
            self._note_due(await cur.fetchone())
        return self.due_in()

    def _note_due(self, row: tuple[Any, ...] | None) -> None:
        self._due = None if row is None or row[0] is None else (max(0.0, float(row[0])), time.monotonic())

    def due_in(self) -> float | None:
        """Seconds until the earliest due tick as of the last claim (or next_due_in), without a query."""
        if self._due is None:
            return None
        seconds, measured = self._due
        return max(0.0, seconds - (time.monotonic() - measured))

    @property
    def has_free_slot(self) -> bool:
        """Could this engine start another attempt? (An attempt ending sets ``finished`` otherwise.)"""
        return not self.stopping and self._slots.free > 0

    @property
    def running(self) -> int:
        return len(self._running)

    async def dispatch_due(self) -> int:
        """Claim as many due ticks as there are free slots and start them; returns how many started."""
        self.claim_filled = False
        if self.stopping:
            return 0
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
        for claim in claims:
            self._leases.add(claim.lease_token)
            task = asyncio.create_task(self._run_claim(claim))
            self._running.add(task)
            task.add_done_callback(self._attempt_done)
        return len(claims)

    def _attempt_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
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
            wait = poll_s if wait is None else min(wait, poll_s)
            await self.wait_for_work(max(0.0, min(wait, end - time.monotonic())))
        if self._running:
            await asyncio.wait(self._running)
        return total

    # -- one attempt -----------------------------------------------------------------------------
    async def _run_claim(self, claim: Claim) -> None:
        try:
            await self._run_claimed(claim)
        finally:
            self._leases.discard(claim.lease_token)

    def _lose(self, token: uuid.UUID) -> None:
        """Lease renewal found this claim's lease gone: end its attempt (it could not finalise)."""
        self._runner.lose(token)

    async def _run_claimed(self, claim: Claim) -> None:
        job = await self._definition(claim.job_id, claim.definition_version)
        if job is None:  # dropped or altered since the claim: the lease is fenced anyway
            return
        next_planned = job.next_planned_after(claim.planned_ns, claim.anchor_ns)
        started = time.monotonic()
        if log.isEnabledFor(logging.DEBUG):  # one line per attempt at info: its end (docs/daemon.md#logs)
            log.debug("attempt start job=%s tick=%s attempt=%s node=%s", job.name, claim.planned_ns,
                      claim.attempt, self.node_id, extra={"fields": {"job": job.name, "tick": claim.planned_ns,
                                                                     "attempt": claim.attempt,
                                                                     "node": self.node_id}})
        if self._pause:
            await self._pause("claimed")
        result = await self._execute(job, claim, next_planned)
        if self.observer is not None:
            self.observer.attempt(job, claim, result, started, self._principals)
        if log.isEnabledFor(logging.INFO):
            duration_ms = round((time.monotonic() - started) * 1000, 1)
            fields = {"job": job.name, "tick": claim.planned_ns, "attempt": claim.attempt, "node": self.node_id,
                      "duration_ms": duration_ms, "outcome": result}
            log.info("attempt finish job=%s tick=%s attempt=%s node=%s duration_ms=%s outcome=%s", job.name,
                     claim.planned_ns, claim.attempt, self.node_id, duration_ms, result, extra={"fields": fields})

    async def _execute(self, job: JobDefinition, claim: Claim, next_planned: int | None) -> str:
        """Run the attempt as its principal, then record its outcome; returns what _finalise does.

        The principal's connection is held until the outcome is recorded: the attempt's query carried the
        MAC of the claim's token for that backend, good there while the token lives (engine/attempt.py),
        and recording the outcome ends the token. A connection whose attempt could not be recorded is
        closed, never reused for another attempt."""
        if job.call is None:
            return await self._executed(job, claim, next_planned, Outcome(
                False, True, False, sqlstate="42883", message="procedure no longer exists"))
        async with contextlib.AsyncExitStack() as stack:
            try:
                conn = await stack.enter_async_context(self._principals.connection(job.principal))
            except psycopg.OperationalError as exc:  # could not log in as the principal
                return await self._executed(job, claim, next_planned, Outcome(
                    False, not job.non_atomic, False, sqlstate=exc.sqlstate, message=first_line(exc),
                    connection_lost=True))
            outcome = await self._runner.run(conn, job, claim, next_planned, self.cancel,
                                             self._principals.session_key(conn))
            if outcome.cleaned:
                self._principals.mark_clean(conn)
            try:
                return await self._executed(job, claim, next_planned, outcome)
            except BaseException:
                await conn.close()
                raise
        raise AssertionError("unreachable")  # pragma: no cover (mypy: the exit stack swallows nothing)

    async def _executed(self, job: JobDefinition, claim: Claim, next_planned: int | None,
                        outcome: Outcome) -> str:
        if self._pause:
            await self._pause("executed")
        return await self._finalise(job, claim, next_planned, outcome)

    async def _finalise(self, job: JobDefinition, claim: Claim, next_planned: int | None,
                        outcome: Outcome) -> str:
        """Record the outcome (fenced); returns succeeded / retrying / failed (by category)."""
        if outcome.in_doubt and await self._committed(claim):
            outcome = Outcome(succeeded=True, atomic=True, finalised=True)
        if outcome.succeeded:
            self.counters["successes"] += 1
            if not outcome.finalised:
                await self._finish(claim, "succeeded", None, 0, next_planned, outcome)
            return "succeeded"
        cause = retry.classify(outcome.sqlstate, outcome.message, deadline_expired=outcome.deadline_expired,
                               cancel_requested=outcome.cancel_requested,
                               connection_lost=outcome.connection_lost)
        failure = retry.attempt_failure(cause, sqlstate=outcome.sqlstate, message=outcome.message,
                                        job_id=claim.job_id, attempt=claim.attempt,
                                        planned_at_ns=claim.planned_ns, idempotency_key=claim.idempotency_key)
        decision = retry.decide(claim.attempt, cause, job.max_attempts)
        self.counters[f"failures_{cause.category}"] += 1
        self.last_error = failure.to_json()
        if decision.retry:
            self.counters["retries"] += 1
        await self._finish(claim, "retrying" if decision.retry else "failed", failure.to_json(),
                           decision.delay_ns, next_planned, outcome)
        return f"{'retrying' if decision.retry else 'failed'}:{cause.category}"

    async def _finish(self, claim: Claim, status: str, error: dict[str, Any] | None, delay_ns: int,
                      next_planned: int | None, outcome: Outcome) -> None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT radix.finish_attempt(%s, %s, %s, %s, %s, %s, %s, %s)",
                (claim.job_id, claim.lease_token, status, Jsonb(error) if error else None,
                 delay_ns, next_planned, outcome.atomic, outcome.became_non_atomic))
            row = await cur.fetchone()
        if not (row and row[0]):
            self.counters["leases_lost"] += 1
            log.warning("lease lost job=%s tick=%s attempt=%s node=%s", claim.job_id, claim.planned_ns,
                        claim.attempt, self.node_id)

    async def _committed(self, claim: Claim) -> bool:
        """Did an in-doubt atomic COMMIT land? Its marker says so in the history."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT EXISTS (SELECT 1 FROM radix.radix_system_job_history WHERE job_id = %s "
                "AND planned_ns = %s AND attempt = %s AND status = 'succeeded')",
                (claim.job_id, claim.planned_ns, claim.attempt))
            row = await cur.fetchone()
        return bool(row and row[0])

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
