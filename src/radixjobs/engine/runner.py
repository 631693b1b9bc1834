"""The engine for one database: claim due ticks, run each as its principal, finalise, repeat.

Verbs (each one database round trip, each with its invariant):
- ``plan_cron``: cron ticks are computed here (Python), coalesced to the latest due one, and stored.
- ``claim_due``: a conditional update decided by the database clock; see radix.claim_due.
- ``finish``: a fenced write of an observed outcome; does nothing when the lease was lost.
- ``release``: hand back unstarted claims on shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from radixjobs import retry
from radixjobs.db import first_line
from radixjobs.engine.attempt import AttemptRunner, Claim, Outcome
from radixjobs.engine.definitions import LOAD_DEFINITIONS, JobDefinition, definition_from_row
from radixjobs.engine.planning import plan_cron
from radixjobs.engine.principals import PrincipalPools

log = logging.getLogger("radixjobs.engine")

CLAIM_BATCH = 64

# Test hook: awaited at "claimed" (before the attempt) and "executed" (before finalisation), so crash
# tests can kill the process at exactly those points.
Pause = Callable[[str], Awaitable[None]]


def default_node_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Engine:
    """Runs due work of one database. ``async with Engine(dsn) as e: await e.run_due()``."""

    def __init__(self, dsn: str, *, node_id: str | None = None, concurrency: int = 8,
                 grace_s: float = 5.0, pause: Pause | None = None):
        self.dsn = dsn
        self.node_id = node_id or default_node_id()
        self.concurrency = concurrency
        self.counters: Counter[str] = Counter()
        self.last_error: dict[str, Any] | None = None
        self._definitions: dict[tuple[uuid.UUID, int], JobDefinition] = {}
        self._pool = AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False,
                                         kwargs={"autocommit": True}, name="radix-scheduler")
        self._control: psycopg.AsyncConnection[Any] | None = None
        self._principals = PrincipalPools(dsn, max_idle=concurrency)
        self._runner = AttemptRunner(self._terminate, grace_s=grace_s)
        self._slots = asyncio.Semaphore(concurrency)
        self._running: set[asyncio.Task[None]] = set()
        self.cancel = asyncio.Event()
        self._pause = pause

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open connections and register this node; its advisory lock marks it alive."""
        await self._pool.open(wait=True)
        self._control = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        cur = await self._control.execute("SELECT radix.register_node(%s, %s, %s)",
                                          (self.node_id, socket.gethostname(), os.getpid()))
        row = await cur.fetchone()
        assert row is not None
        await self._control.execute("SELECT pg_advisory_lock(radix.node_lock_class(), %s)", (row[0],))

    async def close(self) -> None:
        """Wait for running attempts, hand back unstarted claims, close every connection."""
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        try:
            async with self._pool.connection() as conn:
                await conn.execute("SELECT radix.release_claims(%s)", (self.node_id,))
        except psycopg.Error as exc:
            log.warning("release of claims failed node=%s error=%s", self.node_id, exc)
        await self._principals.close()
        await self._pool.close()
        if self._control is not None:
            await self._control.close()

    # -- verbs -----------------------------------------------------------------------------------
    async def claim_due(self, limit: int) -> list[Claim]:
        """Claim up to ``limit`` due ticks (plans due cron ticks first)."""
        async with self._pool.connection() as conn:
            self.counters["coalesced_ticks"] += await plan_cron(conn)
            cur = await conn.execute("SELECT * FROM radix.claim_due(%s, %s)", (self.node_id, limit))
            claims = [Claim(*row) for row in await cur.fetchall()]
        for claim in claims:
            self.counters["claims"] += 1
            self.counters["coalesced_ticks"] += claim.coalesced
            if claim.resumed:
                self.counters["lease_recoveries"] += 1
        return claims

    async def next_due_in(self) -> float | None:
        """Seconds until the earliest due tick (0 when one is due now), or None when nothing is planned."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT (min(due_ns) - radix.to_ns(clock_timestamp())) / 1e9 FROM radix.radix_system_job_state "
                "WHERE status IN ('scheduled', 'running', 'retry_wait')")
            row = await cur.fetchone()
        return None if row is None or row[0] is None else max(0.0, float(row[0]))

    async def run_due(self) -> int:
        """Claim and run everything due now; returns the number of attempts run."""
        total = 0
        while True:
            claims = await self.claim_due(CLAIM_BATCH)
            if not claims:
                break
            total += len(claims)
            await asyncio.gather(*(self._run_claim(c) for c in claims))
        return total

    async def run_for(self, seconds: float, poll_s: float = 1.0) -> int:
        """Run due work as it comes due for ``seconds``; returns the number of attempts run."""
        end = time.monotonic() + seconds
        total = 0
        while time.monotonic() < end and not self.cancel.is_set():
            total += await self.run_due()
            wait = await self.next_due_in()
            wait = poll_s if wait is None else min(wait, poll_s)
            await asyncio.sleep(max(0.0, min(wait, end - time.monotonic())))
        return total

    # -- one attempt -----------------------------------------------------------------------------
    async def _run_claim(self, claim: Claim) -> None:
        async with self._slots:
            job = await self._definition(claim.job_id, claim.definition_version)
            if job is None:  # dropped or altered since the claim: the lease is fenced anyway
                return
            next_planned = job.next_planned_after(claim.planned_ns, claim.anchor_ns)
            started = time.monotonic()
            log.info("attempt start job=%s tick=%s attempt=%s node=%s", job.name, claim.planned_ns,
                     claim.attempt, self.node_id)
            if self._pause:
                await self._pause("claimed")
            outcome = await self._execute(job, claim, next_planned)
            if self._pause:
                await self._pause("executed")
            await self._finalise(job, claim, next_planned, outcome)
            log.info("attempt finish job=%s tick=%s attempt=%s node=%s duration_ms=%.1f outcome=%s",
                     job.name, claim.planned_ns, claim.attempt, self.node_id,
                     (time.monotonic() - started) * 1000, "succeeded" if outcome.succeeded else "failed")

    async def _execute(self, job: JobDefinition, claim: Claim, next_planned: int | None) -> Outcome:
        if job.call is None:
            return Outcome(False, True, False, sqlstate="42883", message="procedure no longer exists")
        try:
            async with self._principals.connection(job.principal) as conn:
                return await self._runner.run(conn, job, claim, next_planned, self.cancel)
        except psycopg.OperationalError as exc:  # could not log in as the principal
            return Outcome(False, not job.non_atomic, False, sqlstate=exc.sqlstate,
                           message=first_line(exc), connection_lost=True)

    async def _finalise(self, job: JobDefinition, claim: Claim, next_planned: int | None,
                        outcome: Outcome) -> None:
        if outcome.in_doubt and await self._committed(claim):
            outcome = Outcome(succeeded=True, atomic=True, finalised=True)
        if outcome.succeeded:
            self.counters["successes"] += 1
            if not outcome.finalised:
                await self._finish(claim, "succeeded", None, 0, next_planned, outcome)
            return
        cause = retry.classify(outcome.sqlstate, outcome.message, deadline_expired=outcome.deadline_expired,
                               cancel_requested=outcome.cancel_requested,
                               connection_lost=outcome.connection_lost)
        failure = retry.attempt_failure(cause, sqlstate=outcome.sqlstate, message=outcome.message,
                                        job_id=claim.job_id, attempt=claim.attempt,
                                        planned_at_ns=claim.planned_ns, idempotency_key=claim.idempotency_key)
        decision = retry.decide(claim.attempt, cause)
        self.counters[f"failures_{cause.category}"] += 1
        self.last_error = failure.to_json()
        if decision.retry:
            self.counters["retries"] += 1
        await self._finish(claim, "retrying" if decision.retry else "failed", failure.to_json(),
                           decision.delay_ns, next_planned, outcome)

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
        key = (job_id, version)
        if key not in self._definitions:
            async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(LOAD_DEFINITIONS, ([job_id],))
                row = await cur.fetchone()
            if row is None or int(row["definition_version"]) != version:
                return None
            self._definitions[key] = definition_from_row(row)
        return self._definitions[key]

    async def _terminate(self, pid: int) -> None:
        """End a principal backend from the scheduler's own connection (deadline + grace passed)."""
        self.counters["terminations"] += 1
        async with self._pool.connection() as conn:
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
