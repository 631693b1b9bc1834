"""Running one attempt for an Engine and recording its outcome, on both paths (engine/runner.py).

The lease path (``_run_claim``): a claim of radix.claim_due, run as its principal (engine/attempt.py),
then its outcome written by radix.finish_attempt, fenced by the lease token.

The one-transaction path (``_run_tick``): a tick of radix.find_ticks, run and recorded in one transaction
(engine/ticks.py). Only a tick that did not commit touches the lease path: it is claimed as a lease of that
very tick (radix.claim_tick; nothing is claimed when the tick changed or ran elsewhere meanwhile), and then
recorded, or run non-atomically (2D000), exactly as a claim is. A tick still running after
PUBLISH_AFTER_S is published as a lease, renewed and fenced like one.

Invariants, both paths: the principal's connection is held until the attempt's outcome is recorded (its
query carried a MAC good on that backend while the token lives), and closed when it could not be; the
in-doubt COMMIT is read from the history; a success is counted once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from radixjobs import retry
from radixjobs.db import first_line
from radixjobs.engine.attempt import NON_ATOMIC_SQLSTATE, AttemptRunner, Claim, Outcome
from radixjobs.engine.definitions import JobDefinition
from radixjobs.engine.principals import PrincipalPools
from radixjobs.engine.ticks import CLAIM_TICK, PUBLISH_AFTER_S, RECORD_LOST_TICK, Durations, Tick, tick_query

if TYPE_CHECKING:
    from radixjobs.engine.observer import Observer

log = logging.getLogger("radixjobs.engine")

# Successful attempts logged at info per second (every failure is; docs/daemon.md#logs).
SUCCESS_LINES_PER_S = 10

# Test hook: awaited at "claimed" (before the attempt) and "executed" (before finalisation), so crash
# tests can kill the process at exactly those points.
Pause = Callable[[str], Awaitable[None]]


def tick_claim(tick: Tick) -> Claim:
    """The tick as the claim it is not (yet): its token stands for the lease token."""
    return Claim(tick.job_id, tick.definition_version, tick.token, tick.planned_ns, tick.attempt,
                 f"{tick.job_id}/{tick.planned_ns}", False, tick.coalesced, tick.anchor_ns)


class Execution:
    """The attempts of an Engine: what it provides, then the two paths."""

    node_id: str
    counters: Counter[str]
    last_error: dict[str, Any] | None
    observer: Observer | None
    cancel: asyncio.Event
    lease_s: int
    _pool: AsyncConnectionPool[Any]
    _principals: PrincipalPools
    _runner: AttemptRunner
    _leases: set[uuid.UUID]
    _pause: Pause | None
    _ticking: dict[uuid.UUID, Tick]
    _ticking_by: Counter[int]
    _durations: Durations
    _node_hex: str
    ahead: float | None = None  # the earliest next tick of a job whose attempt ended here, not yet looked for
    _log_second = 0.0
    _log_budget = SUCCESS_LINES_PER_S
    _log_skipped = 0

    async def _definition(self, job_id: uuid.UUID, version: int) -> JobDefinition | None:
        raise NotImplementedError

    # -- the lease path ------------------------------------------------------------------------------
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
        self._attempt_logged(job, claim, result, started, next_planned)

    # -- the one-transaction path --------------------------------------------------------------------
    async def _run_tick(self, tick: Tick) -> None:
        try:
            job = await self._definition(tick.job_id, tick.definition_version)
            if job is None:  # dropped since it was found
                return
            if self._pause:
                await self._pause("claimed")
            await self._tick_alone(job, tick, job.next_planned_after(tick.planned_ns, tick.anchor_ns))
        finally:
            self._done_ticking([tick])

    async def _tick_alone(self, job: JobDefinition, tick: Tick, next_planned: int | None) -> None:
        """Run the tick in its own transaction (or as the lease path takes it), and log its end."""
        claim = tick_claim(tick)
        started = time.monotonic()
        result = await self._execute_tick(job, tick, claim, next_planned)
        if result is not None:
            self._attempt_logged(job, claim, result, started, next_planned)

    def _done_ticking(self, ticks: list[Tick]) -> None:
        """The ticks of one principal connection (one tick, or a batch: engine/batches.py) are over here."""
        for tick in ticks:
            self._ticking.pop(tick.job_id, None)
        principal = ticks[0].principal
        self._ticking_by[principal] -= 1
        if self._ticking_by[principal] <= 0:
            del self._ticking_by[principal]

    async def _execute_tick(self, job: JobDefinition, tick: Tick, claim: Claim,
                            next_planned: int | None) -> str | None:
        """Run the tick in one transaction as its principal; a tick that did not commit is recorded as a
        lease of that tick (radix.claim_tick) and finished on the lease path. None: the tick was not this
        node's to run (run elsewhere, or changed since it was found), and nothing is recorded.

        As in _execute, the principal's connection is held until the outcome is recorded; one whose tick
        could not be recorded is closed (the MAC in its query stays good there while the tick is as found)."""
        if job.call is None or job.non_atomic:  # the lease path's own business
            leased = await self._claim_tick(tick, publish=False)
            return None if leased is None else await self._run_leased(leased)
        async with contextlib.AsyncExitStack() as stack:
            try:
                conn = await stack.enter_async_context(self._principals.connection(job.principal))
            except psycopg.OperationalError as exc:  # could not log in as the principal
                failed = Outcome(False, True, False, sqlstate=exc.sqlstate, message=first_line(exc),
                                 connection_lost=True)
                leased = await self._claim_tick(tick, publish=False)
                return None if leased is None else await self._executed(job, leased, next_planned, failed)
            published: list[Claim] = []
            publishing: list[asyncio.Task[None]] = []
            started = datetime.datetime.now(datetime.UTC)
            timer = asyncio.get_running_loop().call_later(PUBLISH_AFTER_S, lambda: publishing.append(
                asyncio.create_task(self._publish(conn, tick, published, started))))
            query = tick_query(job.call, tick, job.deadline_ms, next_planned, self._principals.session_key(conn),
                               self._node_hex)
            began = time.monotonic()
            try:
                outcome = await self._runner.run(conn, job, claim, next_planned, self.cancel,
                                                 self._principals.session_key(conn), query)
                if outcome.succeeded:  # the query's own time, for batches (engine/batches.py)
                    self._durations.note(job.signature, (time.monotonic() - began) * 1000)
            finally:
                timer.cancel()
                if publishing:
                    await asyncio.gather(*publishing, return_exceptions=True)
                for lease in published:
                    self._leases.discard(lease.lease_token)
            if outcome.cleaned:
                self._principals.mark_clean(conn)
            try:
                return await self._tick_outcome(conn, job, tick, claim, next_planned, outcome, published, started)
            except BaseException:
                await conn.close()
                raise
        raise AssertionError("unreachable")  # pragma: no cover (mypy: the exit stack swallows nothing)

    async def _tick_outcome(self, conn: psycopg.AsyncConnection[Any], job: JobDefinition, tick: Tick,
                            claim: Claim, next_planned: int | None, outcome: Outcome,
                            published: list[Claim], started: datetime.datetime) -> str | None:
        if outcome.elsewhere:  # begin_tick refused it: nothing ran, nothing to record
            self.counters["ticks_refused"] += 1
            log.debug("tick run elsewhere job=%s tick=%s node=%s: %s", job.name, tick.planned_ns, self.node_id,
                      outcome.message)
            return None
        if not outcome.succeeded and outcome.in_doubt and await self._committed(claim):
            outcome = Outcome(succeeded=True, atomic=True, finalised=True)
        if outcome.succeeded:
            if self._pause:
                await self._pause("executed")
            self.counters["successes"] += 1
            return "succeeded"
        ended = datetime.datetime.now(datetime.UTC)
        leased = published[0] if published else await self._claim_tick(tick, publish=False, started=started)
        if leased is None:  # changed under it (ALTER JOB), or taken by another node meanwhile
            await conn.close()
            self.counters["leases_lost"] += 1
            async with self._pool.connection() as scheduler:
                await scheduler.execute(RECORD_LOST_TICK, (self.node_id, tick.job_id, tick.planned_ns, tick.attempt,
                                                           started, ended, outcome.sqlstate))
            return "lease_lost"
        if outcome.sqlstate == NON_ATOMIC_SQLSTATE:
            # the procedure commits inside: run it as the lease path does, at-least-once, on this connection
            self._leases.add(leased.lease_token)
            try:
                outcome = await self._runner.run(conn, dataclasses.replace(job, non_atomic=True), leased,
                                                 next_planned, self.cancel, self._principals.session_key(conn))
            finally:
                self._leases.discard(leased.lease_token)
            outcome.became_non_atomic = True
        return await self._executed(job, leased, next_planned, outcome)

    async def _publish(self, conn: psycopg.AsyncConnection[Any], tick: Tick, published: list[Claim],
                       started: datetime.datetime) -> None:
        """The tick has run for PUBLISH_AFTER_S: make it a lease of this node (the state shows it running,
        its lease is renewed and fenced like any other). A tick found changed is ended now: it could not
        commit (ALTER JOB re-armed its job, or DROP JOB ... CASCADE)."""
        try:
            leased = await self._claim_tick(tick, publish=True, started=started)
        except psycopg.Error as exc:
            log.warning("publishing a running tick failed node=%s error=%s", self.node_id, first_line(exc))
            return
        if leased is None:
            self._runner.end(conn)
            return
        published.append(leased)
        self._leases.add(leased.lease_token)
        self._runner.hold(conn, leased.lease_token)

    async def _claim_tick(self, tick: Tick, *, publish: bool,
                          started: datetime.datetime | None = None) -> Claim | None:
        """The tick as a lease of this node (radix.claim_tick), or None when it is no longer as found;
        ``started``: when its attempt began."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(CLAIM_TICK, (self.node_id, tick.job_id, tick.planned_ns, tick.token,
                                                  self.lease_s, publish, started))
            row = await cur.fetchone()
        return None if row is None else Claim(*row)

    async def _run_leased(self, claim: Claim) -> str:
        self._leases.add(claim.lease_token)
        try:
            job = await self._definition(claim.job_id, claim.definition_version)
            if job is None:
                return "dropped"
            return await self._execute(job, claim, job.next_planned_after(claim.planned_ns, claim.anchor_ns))
        finally:
            self._leases.discard(claim.lease_token)

    # -- both ------------------------------------------------------------------------------------------
    def _attempt_logged(self, job: JobDefinition, claim: Claim, result: str, started: float,
                        next_planned_ns: int | None) -> None:
        """The attempt's end: its job's next tick noted (``ahead``), its histogram and span, and its log line
        (docs/daemon.md#logs): every failure; successes at most SUCCESS_LINES_PER_S a second at info (all of
        them at debug), the next line saying how many were left out."""
        if next_planned_ns is not None:  # on this process's monotonic clock
            at = time.monotonic() + (next_planned_ns - time.time_ns()) / 1e9
            self.ahead = at if self.ahead is None else min(self.ahead, at)
        if self.observer is not None:
            self.observer.attempt(job, claim, result, started, self._principals)
        if not log.isEnabledFor(logging.INFO):
            return
        now = time.monotonic()
        if result == "succeeded" and not log.isEnabledFor(logging.DEBUG):
            if now - self._log_second >= 1.0:
                self._log_second, self._log_budget = now, SUCCESS_LINES_PER_S
            if self._log_budget <= 0:
                self._log_skipped += 1
                return
            self._log_budget -= 1
        duration_ms = round((now - started) * 1000, 1)
        fields: dict[str, Any] = {"job": job.name, "tick": claim.planned_ns, "attempt": claim.attempt,
                                  "node": self.node_id, "duration_ms": duration_ms, "outcome": result}
        skipped, self._log_skipped = self._log_skipped, 0
        if skipped:
            fields["successes_not_logged"] = skipped
        log.info("attempt finish job=%s tick=%s attempt=%s node=%s duration_ms=%s outcome=%s%s", job.name,
                 claim.planned_ns, claim.attempt, self.node_id, duration_ms, result,
                 f" successes_not_logged={skipped}" if skipped else "", extra={"fields": fields})

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
