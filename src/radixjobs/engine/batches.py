"""Tick batches (sql/routines/batch.sql): under a backlog, up to ``BATCH_MAX``
one-transaction ticks of one principal, one owner and one procedure run in one transaction on one principal
connection, ``BEGIN; SELECT … FROM radix.run_ticks(…); COMMIT;`` and the connection's clean, one simple query.

Invariants:
- Only ticks of jobs ``WITH (batch = on)`` join a batch: their owner declared the procedure safe to share a
  transaction (JobDefinition.batch; every other tick is its own transaction). radix.start_ticks reads the
  flag again as the batch starts, and a tick whose job was altered to ``batch = off`` since it was found is
  not started there (RXT03): it runs alone after the batch.
- A batch forms only from a backlog: the queue deals due ticks to free slots first (engine/ticks.py), and a
  batch takes only due ticks left over, so a tick that could start alone never waits for company. The
  leftovers of a principal are dealt evenly among the batches its ticks lead (``BatchRunner.form``).
- The batch's ticks are started at once (radix.start_ticks: their locks and checks), then each tick runs in
  its own subtransaction of radix.run_ticks, its frame (radix.current_*()) in the setting ``radix.tick``
  with a MAC for this transaction: its procedure commits with the batch, or rolls back alone; the ticks
  that ran get their markers at the end of the same statement (radix.end_ticks, one UPDATE and one INSERT
  for all), so a tick's procedure and its marker commit together or not at all.
  run_ticks' row per tick says which step failed (PL/pgSQL variables, out of the procedures' reach); after
  the COMMIT a failed tick takes the lone tick's way for a failure (``TickRunner.outcome``: a lease of that tick,
  then its outcome recorded), on the same connection.
- A batch that did not commit (its statement timeout, the smallest of its ticks', or a cancel aborts it
  whole, as does a tick changed under it; one still running after ``BATCH_RUN_S`` is cancelled) left every
  tick as found: each then runs alone, unless the engine is being cancelled (shutdown), when they stay due.
  When the COMMIT is in doubt, each tick's marker is read from the history, and a tick without one runs
  alone.
- A batch holds its lead's slot, and its ticks are all long or all short as the lead is (its ticks not run
  in it run alone in that slot afterwards): no long tick ever runs in a slot kept from long attempts.
- Only procedures whose last attempt here took at most BATCH_TICK_MS run in batches (ticks.Durations), no
  more of them than take BATCH_BUDGET_MS at that duration: a batch holds its ticks' locks and hides their
  effects until its COMMIT, so no long procedure holds others, nor many short ones for long.
- The ticks of a batch share a transaction: its now(), the SET LOCALs of earlier ticks, their temporary
  objects, and the query text (current_query()), which carries every tick's MAC. Hence one principal, one
  owner, one procedure: what one tick's code could do to another, the same code could do to itself. A
  role switched by an earlier tick is caught by run_ticks (RXT02), and that tick runs alone afterwards.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import psycopg

from radixjobs.db import first_line
from radixjobs.engine.attempt import TICK_ROW, AttemptRunner, Outcome, Pause, attempt_mac, cleaned, refusal
from radixjobs.engine.definitions import DefinitionCache, JobDefinition
from radixjobs.engine.inflight import InFlight
from radixjobs.engine.outcomes import OutcomeRecorder
from radixjobs.engine.principals import LoginFailed, PrincipalPools, clean_statement
from radixjobs.engine.tick_runner import TickRunner
from radixjobs.engine.ticks import PUBLISH_AFTER_S, TIMEOUT, Durations, Tick, TickQueue, node_hex, tick_claim

log = logging.getLogger("radixjobs.engine")

# Ticks per batch by default (serve --tick-batch), and at most: each tick's CALL is a subtransaction, and a
# transaction's backend keeps the XIDs of up to 64 in shared memory, past which every snapshot taken
# elsewhere while it runs must look in pg_subtrans (suboverflow); 32 leaves the procedures room for theirs.
BATCH_MAX = 32
BATCH_RUN_S = PUBLISH_AFTER_S  # a batch still running after this is cancelled, its ticks run alone
ROLE_CHANGED_SQLSTATE = "RXT02"  # radix.run_ticks: the session's role changed, the tick was not started
NOT_BATCHED_SQLSTATE = "RXT03"  # radix.start_ticks: the tick's job is not WITH (batch = on), it was not started

# Every value is a quoted literal of digits, hex or a UUID with an explicit cast (as engine/ticks.py); each
# CALL (definitions.build_tick_call) is a dollar-quoted constant. The batch is one statement, bounded by the
# smallest of its ticks' timeouts (ticks.TIMEOUT): a tick starts after the statement did, so none runs past
# its own.
RUN_TICKS = ("SELECT r.failed_at, r.error_sqlstate, r.error_message FROM radix.run_ticks("
             "ARRAY[{jobs}]::pg_catalog.uuid[], ARRAY[{planned}]::pg_catalog.int8[], "
             "ARRAY[{attempts}]::pg_catalog.int4[], ARRAY[{macs}]::pg_catalog.text[], "
             "ARRAY[{calls}]::pg_catalog.text[], ARRAY[{nexts}]::pg_catalog.int8[], '{node}'::pg_catalog.text) r; ")


class Verdict(enum.Enum):
    """What became of a batch's tick when it did not fail in the batch."""

    COMMITTED = enum.auto()  # it ran, and its marker committed with the batch
    ALONE = enum.auto()  # it did not run in the batch, or did not commit with it: it runs alone


def tick_verdict(row: tuple[Any, ...]) -> Verdict | Outcome:
    """A tick's row of radix.run_ticks (failed_at, error_sqlstate, error_message) as a verdict, or as the
    outcome of its failure."""
    failed_at, sqlstate = row[:2]
    if failed_at == "begin" and sqlstate in (ROLE_CHANGED_SQLSTATE, NOT_BATCHED_SQLSTATE):
        return Verdict.ALONE
    return refusal(row) or Verdict.COMMITTED


@dataclass(frozen=True)
class BatchItem:
    """One tick of a batch, with the definition it runs under and the tick after it."""

    job: JobDefinition
    tick: Tick
    next_planned_ns: int | None


def batch_key(job: JobDefinition) -> tuple[str, str, str]:
    return job.principal, job.owner, job.signature


def batch_query(items: list[BatchItem], session_key: bytes, node_hex: str) -> bytes:
    """The batch as one simple query; run_ticks' rows (one per tick, in order) are its result attempt.TICK_ROW."""
    calls = [item.job.tick_call_constant for item in items]
    nexts = ("NULL" if item.next_planned_ns is None else f"'{int(item.next_planned_ns)}'" for item in items)
    run = RUN_TICKS.format(jobs=", ".join(f"'{item.tick.job_id}'" for item in items),
                           planned=", ".join(f"'{int(item.tick.planned_ns)}'" for item in items),
                           attempts=", ".join(f"'{int(item.tick.attempt)}'" for item in items),
                           macs=", ".join(f"'{attempt_mac(session_key, item.tick.token)}'" for item in items),
                           calls=", ".join(calls), nexts=", ".join(nexts), node=node_hex)
    deadline_ms = min(int(item.job.deadline_ms) for item in items)
    return b"".join((b"BEGIN; ", TIMEOUT.format(ms=deadline_ms).encode(), run.encode(), b"COMMIT; ",
                     clean_statement()))


class BatchRunner:
    """Forms batches from the queue of found ticks (for the dispatcher), runs them, and has each tick's
    outcome recorded as a lone tick's (TickRunner.outcome)."""

    def __init__(self, node_id: str, tick_batch: int, queue: TickQueue, definitions: DefinitionCache,
                 durations: Durations, principals: PrincipalPools, attempts: AttemptRunner,
                 recorder: OutcomeRecorder, tick_runner: TickRunner, inflight: InFlight, cancel: asyncio.Event,
                 pause: Pause | None):
        self.node_id = node_id
        self._node_hex = node_hex(node_id)
        self.tick_batch = tick_batch  # ticks per batch; 1: each alone
        self._queue = queue
        self._definitions = definitions
        self._durations = durations
        self._principals = principals
        self._attempts = attempts
        self._recorder = recorder
        self._tick_runner = tick_runner
        self._inflight = inflight
        self._cancel = cancel
        self._pause = pause
        self.counters = recorder.counters

    def _batchable(self, job: JobDefinition | None) -> bool:
        return (job is not None and job.batch and job.tick_call is not None and not job.non_atomic
                and self._durations.short(job.signature))

    def form(self, lead: Tick, now: float, leads_left: Counter[int]) -> list[BatchItem]:
        """A batch led by ``lead``: the due ticks still queued of the same principal, owner and procedure,
        long as the lead is or short as it is (the batch holds the lead's slot, and its ticks not run in it
        then run alone there), an even share of them among the ``leads_left`` of that principal (this one
        included), up to ``tick_batch`` in all and to what fits the procedure's BATCH_BUDGET_MS (none when
        ``lead`` may not run in a batch or has no company)."""
        leads = leads_left[lead.principal]
        leads_left[lead.principal] -= 1
        job = self._definitions.get((lead.job_id, lead.definition_version))
        if job is None or not self._batchable(job):
            return []
        share = -(-self._queue.due(lead.principal, now) // leads)  # rounded up
        limit = min(self.tick_batch, self._durations.batch_size(job.signature), share + 1) - 1
        key = batch_key(job)
        members = {lead.job_id: job}
        long = self._queue.is_long(lead)

        def fits(tick: Tick) -> bool:
            other = self._definitions.get((tick.job_id, tick.definition_version))
            if (other is None or not self._batchable(other) or batch_key(other) != key
                    or self._queue.is_long(tick) != long):
                return False
            members[tick.job_id] = other
            return True

        others = self._queue.take_like(lead, limit, now, fits)
        if not others:
            return []
        self.counters["batched_ticks"] += 1 + len(others)
        return [BatchItem(members[t.job_id], t, members[t.job_id].next_planned_after(t.planned_ns, t.anchor_ns))
                for t in [lead, *others]]

    async def run(self, items: list[BatchItem]) -> None:
        """A batch the dispatcher started, in the slot it reserved for its lead."""
        try:
            for item in await self._execute(items):  # not run in the batch: each alone
                await self._tick_runner.run_alone(item.job, item.tick, item.next_planned_ns)
        finally:
            self._inflight.ticks_ended([item.tick for item in items])

    async def _execute(self, items: list[BatchItem]) -> list[BatchItem]:
        """Run the batch and record each tick's outcome; returns the ticks to run alone."""
        job = items[0].job
        started = time.monotonic()
        if self._pause:
            await self._pause("claimed")
        try:
            async with self._principals.attempt(job.principal) as conn:
                began = datetime.datetime.now(datetime.UTC)
                query = batch_query(items, self._principals.session_key(conn), self._node_hex)
                sent = time.monotonic()
                outcome, cur = await self._attempts.run_batch(conn, query, BATCH_RUN_S, self._cancel)
                elapsed_ms = (time.monotonic() - sent) * 1000
                if cur is None:
                    self._durations.note(job.signature, elapsed_ms)  # too slow, or failed whole: alone next
                    if self._cancel.is_set():  # shutting down: the ticks stay due, for the next node or start
                        return []
                    if not outcome.in_doubt:  # rolled back: nothing of it committed
                        return items
                    # a tick without its marker did not commit: it runs alone
                    verdicts: list[Verdict | Outcome] = [
                        Verdict.COMMITTED if await self._recorder.committed(item.tick.job_id, item.tick.planned_ns,
                                                                            item.tick.attempt) else Verdict.ALONE
                        for item in items]
                else:
                    self._durations.note(job.signature, elapsed_ms / len(items))
                    if await cleaned(cur):
                        self._principals.mark_clean(conn)
                    verdicts = [tick_verdict(row) for row in await (await cur.set_result(TICK_ROW)).fetchall()]
                return await self._record(conn, items, verdicts, began, started)
        except LoginFailed as failed:  # could not log in: each tick fails alone, as it would
            log.debug("batch not run node=%s: %s", self.node_id, first_line(failed.error))
            return items

    async def _record(self, conn: psycopg.AsyncConnection[Any], items: list[BatchItem],
                      verdicts: list[Verdict | Outcome], began: datetime.datetime,
                      started: float) -> list[BatchItem]:
        """Each tick's outcome as run_ticks reported it, recorded as a lone tick's; returns those not run."""
        alone: list[BatchItem] = []
        for item, verdict in zip(items, verdicts, strict=True):
            if verdict is Verdict.ALONE:
                alone.append(item)
                continue
            outcome = Outcome.landed() if verdict is Verdict.COMMITTED else verdict
            result = await self._tick_runner.outcome(conn, item.job, item.tick, item.next_planned_ns, outcome, [],
                                                     began)
            if result is not None:
                self._recorder.ended(item.job, tick_claim(item.tick), result, started, item.next_planned_ns)
        return alone
