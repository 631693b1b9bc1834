"""The one-transaction path for a lone tick (an engine's tick runner, composed by engine/runner.py): a tick
of radix.find_ticks, run and recorded in one transaction on its principal's connection (engine/ticks.py).
A batch's ticks take the same way for their outcomes (engine/batches.py, ``outcome``).

Only a tick that did not commit touches the lease path: it is claimed as a lease of that very tick
(radix.claim_tick; nothing is claimed when the tick changed or ran elsewhere meanwhile), and then recorded,
or run non-atomically (2D000), exactly as a claim is (engine/lease_runner.py). A tick still running after
PUBLISH_AFTER_S is published as a lease, renewed and fenced like one.

Invariants:
- The principal's connection is held until the tick's outcome is recorded (its query carried a MAC good
  on that backend while the tick is as found), and closed when it could not be (principals.PrincipalAttempt).
- A tick refused by radix.start_tick (RXT01 in run_tick's row: run elsewhere, or changed since found) ran
  nothing and records nothing, unless this node had published it first (its query reached the start after
  PUBLISH_AFTER_S): that lease is then run on the lease path at once. The in-doubt COMMIT is read from the history
  (OutcomeRecorder.committed); a success is counted once.
- A tick is in InFlight.ticks, and its connection counted in InFlight.tick_connections, until its attempt is
  over; a lease it was published or recorded as is in InFlight.leases only while its attempt runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from radixjobs.db import first_line
from radixjobs.engine.attempt import NON_ATOMIC_SQLSTATE, AttemptRunner, Claim, Outcome, Pause
from radixjobs.engine.definitions import DefinitionCache, JobDefinition, load_definition
from radixjobs.engine.inflight import InFlight
from radixjobs.engine.lease_runner import LeaseRunner
from radixjobs.engine.outcomes import OutcomeRecorder
from radixjobs.engine.principals import LoginFailed, PrincipalPools
from radixjobs.engine.ticks import CLAIM_TICK, PUBLISH_AFTER_S, Durations, Tick, node_hex, tick_claim, tick_query

log = logging.getLogger("radixjobs.engine")


class TickRunner:
    """Runs lone ticks, each in one transaction as its principal, and records those that did not commit."""

    def __init__(self, pool: AsyncConnectionPool[Any], node_id: str, lease_s: int, definitions: DefinitionCache,
                 durations: Durations, principals: PrincipalPools, attempts: AttemptRunner,
                 recorder: OutcomeRecorder, lease_runner: LeaseRunner, inflight: InFlight, cancel: asyncio.Event,
                 pause: Pause | None):
        self._pool = pool
        self.node_id = node_id
        self._node_hex = node_hex(node_id)
        self.lease_s = lease_s
        self._definitions = definitions
        self._durations = durations  # procedures' last attempts here: only short ones batch
        self._principals = principals
        self._attempts = attempts
        self._recorder = recorder
        self._lease_runner = lease_runner
        self._inflight = inflight
        self._cancel = cancel
        self._pause = pause
        self.counters = recorder.counters

    async def run(self, tick: Tick) -> None:
        """A tick the dispatcher started alone, in the slot it reserved for it."""
        try:
            job = await load_definition(self._pool, self._definitions, tick.job_id, tick.definition_version)
            if job is None:  # dropped since it was found
                return
            if self._pause:
                await self._pause("claimed")
            await self.run_alone(job, tick, job.next_planned_after(tick.planned_ns, tick.anchor_ns))
        finally:
            self._inflight.ticks_ended([tick])

    async def run_alone(self, job: JobDefinition, tick: Tick, next_planned: int | None) -> None:
        """Run the tick in its own transaction (or as the lease path takes it), and note its end."""
        claim = tick_claim(tick)
        started = time.monotonic()
        result = await self._execute(job, tick, claim, next_planned)
        if result is not None:
            self._recorder.ended(job, claim, result, started, next_planned)

    async def _execute(self, job: JobDefinition, tick: Tick, claim: Claim, next_planned: int | None) -> str | None:
        """Run the tick in one transaction as its principal; a tick that did not commit is recorded as a
        lease of that tick (radix.claim_tick) and finished on the lease path. None: the tick was not this
        node's to run (run elsewhere, or changed since it was found), and nothing is recorded."""
        if job.tick_call is None or job.non_atomic:  # the lease path's own business
            leased = await self._claim_tick(tick, publish=False)
            return None if leased is None else await self._lease_runner.run_leased(leased)
        try:
            async with self._principals.attempt(job.principal) as conn:
                published: list[Claim] = []
                publishing: list[asyncio.Task[None]] = []
                started = datetime.datetime.now(datetime.UTC)
                timer = asyncio.get_running_loop().call_later(PUBLISH_AFTER_S, lambda: publishing.append(
                    asyncio.create_task(self._publish(conn, tick, published, started))))
                query = tick_query(job.tick_call_constant, tick, job.deadline_ms, next_planned,
                                   self._principals.session_key(conn), self._node_hex)
                began = time.monotonic()
                try:
                    outcome = await self._attempts.run(conn, job, claim, next_planned, self._cancel,
                                                       self._principals.session_key(conn), query)
                    if outcome.succeeded:  # the query's own time, for batches (engine/batches.py)
                        self._durations.note(job.signature, (time.monotonic() - began) * 1000)
                finally:
                    timer.cancel()
                    if publishing:
                        await asyncio.gather(*publishing, return_exceptions=True)
                    for lease in published:
                        self._inflight.leases.discard(lease.lease_token)
                if outcome.cleaned:
                    self._principals.mark_clean(conn)
                if not (outcome.elsewhere and published):
                    return await self.outcome(conn, job, tick, next_planned, outcome, published, started)
            # refused, yet published: this node's publication made the tick a lease before its query reached
            # radix.start_tick (a backend slower than PUBLISH_AFTER_S to start it). Nothing ran, and the lease
            # is this node's: the tick runs on the lease path now, not when the lease expires.
            return await self._lease_runner.run_leased(published[0])
        except LoginFailed as failed:  # could not log in as the principal
            refused = Outcome(False, True, False, sqlstate=failed.error.sqlstate, message=first_line(failed.error),
                              connection_lost=True)
            leased = await self._claim_tick(tick, publish=False)
            return None if leased is None else await self._recorder.executed(job, leased, next_planned, refused)

    async def outcome(self, conn: psycopg.AsyncConnection[Any], job: JobDefinition, tick: Tick,
                      next_planned: int | None, outcome: Outcome, published: list[Claim],
                      started: datetime.datetime) -> str | None:
        """Record what became of the tick run on ``conn`` (alone, or in a batch); None: it was not this
        node's to run, and nothing is recorded. ``published``: the lease it was published as, if any."""
        if outcome.elsewhere:  # start_tick refused it: nothing ran, nothing to record
            self.counters["ticks_refused"] += 1
            log.debug("tick run elsewhere job=%s tick=%s node=%s: %s", job.name, tick.planned_ns, self.node_id,
                      outcome.message)
            return None
        if outcome.in_doubt and await self._recorder.committed(tick.job_id, tick.planned_ns, tick.attempt):
            outcome = Outcome.landed()
        if outcome.succeeded:
            if self._pause:
                await self._pause("executed")
            self.counters["successes"] += 1
            return "succeeded"
        ended = datetime.datetime.now(datetime.UTC)
        leased = published[0] if published else await self._claim_tick(tick, publish=False, started=started)
        if leased is None:  # changed under it (ALTER JOB), or taken by another node meanwhile
            await conn.close()
            await self._recorder.record_lost_tick(tick, started, ended, outcome.sqlstate)
            return "lease_lost"
        if outcome.sqlstate == NON_ATOMIC_SQLSTATE:
            # the procedure commits inside: run it as the lease path does, at-least-once, on this connection
            self._inflight.leases.add(leased.lease_token)
            try:
                outcome = await self._attempts.run(conn, dataclasses.replace(job, non_atomic=True), leased,
                                                   next_planned, self._cancel, self._principals.session_key(conn))
            finally:
                self._inflight.leases.discard(leased.lease_token)
            outcome.became_non_atomic = True
        return await self._recorder.executed(job, leased, next_planned, outcome)

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
            self._attempts.end(conn)
            return
        published.append(leased)
        self._inflight.leases.add(leased.lease_token)
        self._attempts.hold(conn, leased.lease_token)

    async def _claim_tick(self, tick: Tick, *, publish: bool,
                          started: datetime.datetime | None = None) -> Claim | None:
        """The tick as a lease of this node (radix.claim_tick), or None when it is no longer as found;
        ``started``: when its attempt began."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(CLAIM_TICK, (self.node_id, tick.job_id, tick.planned_ns, tick.token,
                                                  self.lease_s, publish, started))
            row = await cur.fetchone()
        return None if row is None else Claim(*row)
