"""The lease path (an engine's lease runner, composed by engine/runner.py): a claim of radix.claim_due,
run as its principal (engine/attempt.py), then its outcome written by radix.finish_attempt, fenced by the
lease token (engine/outcomes.py). A one-transaction tick that did not commit, or that the lease path
takes (a non-atomic job, a procedure gone), comes here as a lease of that very tick (``run_leased``).

Invariants:
- A claim's lease token is in InFlight.leases (renewed by engine/leases.py) from the claim until its
  attempt is over, and no longer.
- The principal's connection is held until the attempt's outcome is recorded: the attempt's query carried
  the MAC of the claim's token for that backend, good there while the token lives (engine/attempt.py), and
  recording the outcome ends the token. A connection whose attempt could not be recorded is closed, never
  reused for another attempt (principals.PrincipalAttempt).
- An attempt that could not log in as its principal is recorded as a lost connection (retried as such).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from psycopg_pool import AsyncConnectionPool

from radixjobs.db import first_line
from radixjobs.engine.attempt import AttemptRunner, Claim, Outcome, Pause
from radixjobs.engine.definitions import HOOK_KIND, DefinitionCache, JobDefinition, load_definition, load_hook
from radixjobs.engine.inflight import InFlight
from radixjobs.engine.outcomes import OutcomeRecorder
from radixjobs.engine.principals import LoginFailed, PrincipalPools

log = logging.getLogger("radixjobs.engine")

# undefined_function: what a CALL of the job's procedure reports once the procedure is dropped
PROCEDURE_GONE_SQLSTATE = "42883"


class LeaseRunner:
    """Runs claims, each as its principal, and has their outcomes recorded."""

    def __init__(self, pool: AsyncConnectionPool[Any], node_id: str, definitions: DefinitionCache,
                 principals: PrincipalPools, attempts: AttemptRunner, recorder: OutcomeRecorder,
                 inflight: InFlight, cancel: asyncio.Event, pause: Pause | None):
        self._pool = pool
        self.node_id = node_id
        self._definitions = definitions
        self._principals = principals
        self._attempts = attempts
        self._recorder = recorder
        self._inflight = inflight
        self._cancel = cancel
        self._pause = pause

    async def run_claim(self, claim: Claim) -> None:
        """A claim of radix.claim_due, run in the slot the dispatcher reserved for it."""
        try:
            job = await load_definition(self._pool, self._definitions, claim.job_id, claim.definition_version)
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
            result = await self.execute(job, claim, next_planned)
            self._recorder.ended(job, claim, result, started, next_planned)
        finally:
            self._inflight.leases.discard(claim.lease_token)

    async def run_leased(self, claim: Claim) -> str:
        """A tick made a lease of this node (radix.claim_tick), run as a claim is; returns its result."""
        self._inflight.leases.add(claim.lease_token)
        try:
            job = await load_definition(self._pool, self._definitions, claim.job_id, claim.definition_version)
            if job is None:
                return "dropped"
            return await self.execute(job, claim, job.next_planned_after(claim.planned_ns, claim.anchor_ns))
        finally:
            self._inflight.leases.discard(claim.lease_token)

    async def execute(self, job: JobDefinition, claim: Claim, next_planned: int | None) -> str:
        """Run the attempt as its principal, then record its outcome; returns what the recorder's
        ``finalise`` does. An on_failure hook's claim CALLs the hook instead (definitions.load_hook)."""
        if claim.run_kind == HOOK_KIND:
            job = await load_hook(self._pool, job)
        if job.call is None:
            return await self._recorder.executed(job, claim, next_planned, Outcome(
                False, True, False, sqlstate=PROCEDURE_GONE_SQLSTATE, message="procedure no longer exists"))
        try:
            async with self._principals.attempt(job.principal) as conn:
                outcome = await self._attempts.run(conn, job, claim, next_planned, self._cancel,
                                                   self._principals.session_key(conn))
                if outcome.cleaned:
                    self._principals.mark_clean(conn)
                return await self._recorder.executed(job, claim, next_planned, outcome)
        except LoginFailed as failed:  # could not log in as the principal
            return await self._recorder.executed(job, claim, next_planned, Outcome(
                False, not job.non_atomic, False, sqlstate=failed.error.sqlstate, message=first_line(failed.error),
                connection_lost=True))
