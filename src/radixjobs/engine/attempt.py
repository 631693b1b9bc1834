"""Run one claimed attempt on a connection logged in as the job's principal.

Atomic (the default): ``BEGIN; begin_attempt(marks the tick done); CALL; end_attempt; COMMIT`` — the
procedure's effects and the completion marker commit together or not at all (exactly once).
A procedure that commits inside fails that with 2D000; it is then run non-atomically (autocommit CALL,
at-least-once) and the job is flagged ``non_atomic`` so later ticks go straight to that mode.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from radixjobs.db import first_line
from radixjobs.engine.definitions import JobDefinition

NON_ATOMIC_SQLSTATE = "2D000"


@dataclass(frozen=True)
class Claim:
    """One claimed tick, as claim_due returned it."""

    job_id: uuid.UUID
    definition_version: int
    lease_token: uuid.UUID
    planned_ns: int
    attempt: int
    idempotency_key: str
    resumed: bool
    coalesced: int
    anchor_ns: int


@dataclass
class Outcome:
    """What happened to an attempt, as the engine finalises it."""

    succeeded: bool
    atomic: bool
    finalised: bool  # True when the marker already committed with the procedure (atomic success)
    became_non_atomic: bool = False
    sqlstate: str | None = None
    message: str = ""
    deadline_expired: bool = False
    cancel_requested: bool = False
    connection_lost: bool = False
    in_doubt: bool = False  # the COMMIT's fate is unknown: the engine checks the ledger


Terminate = Callable[[int], Awaitable[None]]


class AttemptRunner:
    """Executes attempts; ``terminate(pid)`` ends a backend from the scheduler's own connection."""

    def __init__(self, terminate: Terminate, *, grace_s: float = 5.0):
        self.terminate = terminate
        self.grace_s = grace_s

    async def run(self, conn: psycopg.AsyncConnection[Any], job: JobDefinition, claim: Claim,
                  next_planned_ns: int | None, cancel: asyncio.Event) -> Outcome:
        """Run the attempt; never raises for failures of the procedure or the connection."""
        atomic = not job.non_atomic
        started = time.monotonic()
        watchdog = asyncio.create_task(self._watch(conn, job, started, cancel))
        try:
            if atomic:
                outcome = await self._atomic(conn, job, claim, next_planned_ns)
                if outcome.sqlstate == NON_ATOMIC_SQLSTATE:
                    # the procedure controls transactions itself: nothing of it was kept; run it the
                    # only way PostgreSQL allows, as a top-level CALL in autocommit (at-least-once)
                    outcome = await self._non_atomic(conn, job, claim, next_planned_ns)
                    outcome.became_non_atomic = True
            else:
                outcome = await self._non_atomic(conn, job, claim, next_planned_ns)
        finally:
            watchdog.cancel()
        elapsed_ms = (time.monotonic() - started) * 1000
        outcome.deadline_expired = not outcome.succeeded and elapsed_ms >= job.deadline_ms
        outcome.cancel_requested = cancel.is_set()
        return outcome

    async def _atomic(self, conn: psycopg.AsyncConnection[Any], job: JobDefinition, claim: Claim,
                      next_planned_ns: int | None) -> Outcome:
        assert job.call is not None
        committing = False
        try:
            async with conn.transaction():
                await conn.execute("SELECT set_config('statement_timeout', %s, true), radix.begin_attempt(%s, %s)",
                                   (str(job.deadline_ms), claim.job_id, claim.lease_token))
                await conn.execute(job.call, job.values)
                await conn.execute("SELECT radix.end_attempt(%s, %s, %s, true)",
                                   (claim.job_id, claim.lease_token, next_planned_ns))
                committing = True
        except psycopg.Error as exc:
            return self._failure(exc, atomic=True, in_doubt=committing)
        return Outcome(succeeded=True, atomic=True, finalised=True)

    async def _non_atomic(self, conn: psycopg.AsyncConnection[Any], job: JobDefinition, claim: Claim,
                          next_planned_ns: int | None) -> Outcome:
        assert job.call is not None
        try:
            await conn.execute("SELECT set_config('statement_timeout', %s, false), radix.begin_attempt(%s, %s)",
                               (str(job.deadline_ms), claim.job_id, claim.lease_token))
            await conn.execute(job.call, job.values)
            await conn.execute("SELECT radix.end_attempt(%s, %s, %s, false)",
                               (claim.job_id, claim.lease_token, next_planned_ns))
        except psycopg.Error as exc:
            return self._failure(exc, atomic=False, in_doubt=False)
        return Outcome(succeeded=True, atomic=False, finalised=False)

    @staticmethod
    def _failure(exc: psycopg.Error, *, atomic: bool, in_doubt: bool) -> Outcome:
        """An Outcome for a failed statement; ``in_doubt`` when the connection broke at COMMIT."""
        message = exc.diag.message_primary or first_line(exc)
        broken = exc.sqlstate is None or exc.sqlstate.startswith("08") or exc.sqlstate.startswith("57P")
        return Outcome(succeeded=False, atomic=atomic, finalised=False, sqlstate=exc.sqlstate,
                       message=message, connection_lost=exc.sqlstate is None,
                       in_doubt=in_doubt and broken)

    async def _watch(self, conn: psycopg.AsyncConnection[Any], job: JobDefinition, started: float,
                     cancel: asyncio.Event) -> None:
        """Past deadline + grace (or on cancel, past the grace), end the backend from outside.

        statement_timeout can be trapped (EXCEPTION WHEN query_canceled) or outlived; termination
        from the scheduler's connection cannot, so the attempt never outlives its lease.
        """
        pid = conn.info.backend_pid
        deadline = started + job.deadline_ms / 1000 + self.grace_s
        cancel_task = asyncio.create_task(cancel.wait())
        try:
            await asyncio.wait({cancel_task}, timeout=max(0.0, deadline - time.monotonic()))
            if cancel.is_set():
                await conn.cancel_safe(timeout=self.grace_s)
                await asyncio.sleep(self.grace_s)
            await self.terminate(pid)
        finally:
            cancel_task.cancel()
