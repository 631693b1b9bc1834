"""Recording what became of an attempt (an engine's outcome recorder, composed by engine/runner.py).

The lease path's outcome is written by radix.finish_attempt, fenced by the lease token (``finalise``). A
one-transaction tick records its own success in its transaction (radix.run_tick); one that did not commit
is recorded here as a lease of that tick would be (engine/tick_runner.py), or as lost when that tick
changed or ran elsewhere meanwhile (``record_lost_tick``). Every attempt's end is then noted once
(``ended``): its job's next tick, its histogram and span, its log line.

Invariants:
- An outcome is written only under the attempt's lease token: radix.finish_attempt does nothing when the
  lease was lost (ALTER JOB re-armed the job, or another node took it), which is counted and logged.
- The fate of an in-doubt COMMIT (a failure after the COMMIT was sent: at COMMIT, in the clean, or a broken
  connection) is read from the history, by one function (``committed``): a tick whose marker is there
  succeeded, and is counted once, as any success.
- The counters are the fixed set COUNTER_KEYS (engine/runner.py): they never grow with jobs or errors.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from radixjobs import retry
from radixjobs.engine.attempt import Claim, Outcome, Pause
from radixjobs.engine.definitions import HOOK_KIND, JobDefinition
from radixjobs.engine.inflight import InFlight
from radixjobs.engine.principals import PrincipalPools
from radixjobs.engine.ticks import RECORD_LOST_TICK, Tick

if TYPE_CHECKING:
    import datetime

    from radixjobs.engine.observer import Observer

log = logging.getLogger("radixjobs.engine")

# Successful attempts logged at info per second (every failure is; docs/daemon.md#logs).
SUCCESS_LINES_PER_S = 10

FINISH_ATTEMPT = "SELECT radix.finish_attempt(%s, %s, %s, %s, %s, %s, %s, %s)"
# An atomic attempt's marker (radix.end_atomic, radix.end_tick, radix.end_ticks) commits with it.
# An on_failure hook's attempts share their tick's planned time: run_kind tells them from the tick's own.
COMMITTED = ("SELECT EXISTS (SELECT 1 FROM radix.radix_system_job_history WHERE job_id = %s "
             "AND planned_ns = %s AND attempt = %s AND status = 'succeeded' AND (run_kind = 'on_failure') = %s)")

# A radix_events event checked against the history (any role may NOTIFY that channel): the job's qualified name
# when that attempt of that tick is recorded failed, read with the scheduler's rights.
FAILED_JOB_NAME = ("SELECT pg_catalog.quote_ident(j.schema_name) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) "
                   "pg_catalog.quote_ident(j.job_name) FROM radix.radix_system_job_history h "
                   "JOIN radix.jobs j ON j.job_id OPERATOR(pg_catalog.=) h.job_id "
                   "WHERE h.job_id OPERATOR(pg_catalog.=) %s::pg_catalog.uuid "
                   "AND h.planned_ns OPERATOR(pg_catalog.=) %s::pg_catalog.int8 "
                   "AND h.attempt OPERATOR(pg_catalog.=) %s::pg_catalog.int4 "
                   "AND h.run_kind OPERATOR(pg_catalog.=) %s::pg_catalog.text "
                   "AND h.status OPERATOR(pg_catalog.=) 'failed'")


class OutcomeRecorder:
    """Writes outcomes on the scheduler's pool, counts them in ``counters``, and notes each attempt's end."""

    def __init__(self, pool: AsyncConnectionPool[Any], node_id: str, counters: Counter[str], inflight: InFlight,
                 principals: PrincipalPools, pause: Pause | None):
        self._pool = pool
        self.node_id = node_id
        self.counters = counters
        self._inflight = inflight
        self._principals = principals
        self._pause = pause
        self.observer: Observer | None = None  # set by the engine (radixjobs.observe)
        self.last_error: dict[str, Any] | None = None  # the last failure recorded, as stored
        self._log_second = 0.0
        self._log_budget = SUCCESS_LINES_PER_S
        self._log_skipped = 0

    async def committed(self, job_id: uuid.UUID, planned_ns: int, attempt: int, hook: bool = False) -> bool:
        """Did an in-doubt atomic COMMIT land? Its marker says so in the history."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(COMMITTED, (job_id, planned_ns, attempt, hook))
            row = await cur.fetchone()
        return bool(row and row[0])

    async def failed_job_name(self, job_id: uuid.UUID, planned_ns: int, attempt: int, run_kind: str) -> str | None:
        """The job's qualified name when that attempt of that tick is recorded failed, else None."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(FAILED_JOB_NAME, (job_id, planned_ns, attempt, run_kind))
            row = await cur.fetchone()
        return None if row is None else str(row[0])

    async def executed(self, job: JobDefinition, claim: Claim, next_planned: int | None, outcome: Outcome) -> str:
        """The attempt ran (or could not start): record its outcome (``finalise``)."""
        if self._pause:
            await self._pause("executed")
        return await self.finalise(job, claim, next_planned, outcome)

    async def finalise(self, job: JobDefinition, claim: Claim, next_planned: int | None, outcome: Outcome) -> str:
        """Record the outcome (fenced); returns succeeded / retrying / failed (by category)."""
        if outcome.in_doubt and await self.committed(claim.job_id, claim.planned_ns, claim.attempt,
                                                     claim.run_kind == HOOK_KIND):
            outcome = Outcome.landed()
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
            cur = await conn.execute(FINISH_ATTEMPT, (claim.job_id, claim.lease_token, status,
                                                      Jsonb(error) if error else None, delay_ns, next_planned,
                                                      outcome.atomic, outcome.became_non_atomic))
            row = await cur.fetchone()
        if not (row and row[0]):
            self.counters["leases_lost"] += 1
            log.warning("lease lost job=%s tick=%s attempt=%s node=%s", claim.job_id, claim.planned_ns,
                        claim.attempt, self.node_id)

    async def record_lost_tick(self, tick: Tick, started: datetime.datetime, ended: datetime.datetime,
                               sqlstate: str | None) -> None:
        """A tick that did not commit could not be made a lease (changed under it, or taken elsewhere):
        its attempt is recorded as lost (radix.record_lost_tick)."""
        self.counters["leases_lost"] += 1
        async with self._pool.connection() as scheduler:
            await scheduler.execute(RECORD_LOST_TICK, (self.node_id, tick.job_id, tick.planned_ns, tick.attempt,
                                                       started, ended, sqlstate))

    def ended(self, job: JobDefinition, claim: Claim, result: str, started: float,
              next_planned_ns: int | None) -> None:
        """The attempt's end: its job's next tick noted (InFlight.ahead), its histogram and span, and its log
        line (docs/daemon.md#logs): every failure; successes at most SUCCESS_LINES_PER_S a second at info
        (all of them at debug), the next line saying how many were left out."""
        if next_planned_ns is not None:  # on this process's monotonic clock
            at = time.monotonic() + (next_planned_ns - time.time_ns()) / 1e9
            inflight = self._inflight
            inflight.ahead = at if inflight.ahead is None else min(inflight.ahead, at)
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
