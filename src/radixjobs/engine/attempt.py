"""Run one claimed attempt on a connection logged in as the job's principal.

Atomic (the default): ``BEGIN; begin_atomic; CALL; end_atomic(marks the tick done); COMMIT; <clean>``, one
simple-protocol query — the procedure's effects and the completion marker commit together or not at all
(exactly once), and the connection's clean runs only after the commit. The query's text is readable by the
procedure (current_query()) and by the principal's other sessions (pg_stat_activity), so it never carries
the lease token: it carries the token's MAC for this backend (``radix._attempt_mac``, sql/routines/tokens.sql), which
no other backend can use. On this backend a MAC is good while its token lives, so the engine does not
reuse the connection for another attempt before the attempt's outcome is recorded
(principals.PrincipalAttempt).
A procedure that commits inside fails that with 2D000; it is then run non-atomically (autocommit CALL,
at-least-once) and the job is flagged ``non_atomic`` so later ticks go straight to that mode.
The CALL is sent inside a DO block (definitions.build_call): OUT/INOUT results never reach the daemon.

The connection is the principal's, with the principal's search_path and settings: every statement sent
here besides the CALL names its functions with their schema and casts its parameters, so nothing the
principal defines is chosen; the watchdog (deadline + grace, then termination from the scheduler's own
connection) bounds all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from radixjobs.db import first_line
from radixjobs.engine.definitions import JobDefinition
from radixjobs.engine.principals import clean_statement

NON_ATOMIC_SQLSTATE = "2D000"  # invalid_transaction_termination: the procedure commits inside
TICK_ELSEWHERE_SQLSTATE = "RXT01"  # radix.start_tick(s): the tick is not this backend's to run
# The result of a tick's query (engine/ticks.py) or a batch's (engine/batches.py) holding run_tick's row or
# run_ticks' rows: BEGIN, the timeout, those rows, COMMIT, the clean.
TICK_ROW = 2

BEGIN_NON_ATOMIC = ("SELECT pg_catalog.set_config('statement_timeout', %s::pg_catalog.text, false), "
                    "radix.begin_attempt(%s::pg_catalog.uuid, %s::pg_catalog.uuid)")
# The job's stored arguments, for the DO block (definitions.ARGUMENTS), once the attempt has its frame: for the
# session (cleared by the clean) when the attempt commits on its own, else for the transaction.
ARGUMENTS_NON_ATOMIC = ("SELECT pg_catalog.set_config('radix.arguments', radix.current_arguments("
                        "%s::pg_catalog.int8)::pg_catalog.text, false)")
END_NON_ATOMIC = "SELECT radix.end_attempt(%s::pg_catalog.uuid, %s::pg_catalog.uuid, %s::pg_catalog.int8, false)"
# Every value is a quoted literal of digits, hex or a UUID with an explicit cast: no backslash for
# standard_conforming_strings to read, no minus sign for a principal's prefix operator "-".
BEGIN_ATOMIC = ("SELECT pg_catalog.set_config('statement_timeout', '{ms}'::pg_catalog.text, true), "
                "radix.begin_atomic('{job}'::pg_catalog.uuid, '{mac}'::pg_catalog.text); "
                "SELECT pg_catalog.set_config('radix.arguments', radix.current_arguments("
                "'{version}'::pg_catalog.int8)::pg_catalog.text, true); ")
END_ATOMIC = "; SELECT radix.end_atomic('{job}'::pg_catalog.uuid, '{mac}'::pg_catalog.text, {next}::pg_catalog.int8)"


def refusal(row: tuple[Any, ...]) -> Outcome | None:
    """A tick's row of radix.run_tick or radix.run_ticks (failed_at, error_sqlstate, error_message) as the
    outcome of its failure, or None when it ran. The row is the function's result: a procedure can raise
    any SQLSTATE, RXT01 included, but never make this row."""
    failed_at, sqlstate, message = row[:3]
    if failed_at is None:
        return None
    return Outcome(False, True, False, sqlstate=sqlstate, message=str(message or ""),
                   elsewhere=failed_at == "begin" and sqlstate == TICK_ELSEWHERE_SQLSTATE)


async def cleaned(cur: psycopg.AsyncCursor[Any]) -> bool:
    """Did the clean at the end of an attempt's query pass its identity check (its last result)?"""
    row = await (await cur.set_result(-1)).fetchone()
    return bool(row and row[0] is True)


def attempt_mac(session_key: bytes, token: uuid.UUID) -> str:
    """The MAC of a lease token for the backend whose session key this is (radix.attempt_session())."""
    return hashlib.sha256(session_key + token.bytes).hexdigest()


def atomic_query(call: bytes, claim: Claim, deadline_ms: int, next_planned_ns: int | None,
                 session_key: bytes) -> bytes:
    """The atomic attempt as one simple query: BEGIN, begin, the CALL (a DO block), end, COMMIT, and then
    the connection's clean (principals.clean_statement), which runs only if the attempt committed."""
    mac = attempt_mac(session_key, claim.lease_token)
    following = "NULL" if next_planned_ns is None else f"'{int(next_planned_ns)}'"
    return b"".join((b"BEGIN; ", BEGIN_ATOMIC.format(ms=int(deadline_ms), job=claim.job_id, mac=mac,
                                         version=int(claim.definition_version)).encode(),
                     call, END_ATOMIC.format(job=claim.job_id, mac=mac, next=following).encode(), b"; COMMIT; ",
                     clean_statement()))


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
    run_kind: str = "schedule"  # what queued the tick: schedule, run, backfill, on_failure (a hook: hooks.py)


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
    cleaned: bool = False  # the connection was cleaned in the attempt's own query (principals.clean)
    elsewhere: bool = False  # a tick not this backend's to run (RXT01: run elsewhere, or changed): nothing ran

    @classmethod
    def landed(cls) -> Outcome:
        """An atomic attempt whose COMMIT landed, its marker with it."""
        return cls(succeeded=True, atomic=True, finalised=True)


Terminate = Callable[[int], Awaitable[None]]
# Test hook: awaited at "claimed" (before the attempt) and "executed" (before its outcome is recorded), so
# crash tests can kill the process at exactly those points.
Pause = Callable[[str], Awaitable[None]]


@dataclass(eq=False)
class _Watched:
    """An attempt in progress, for the watchdog: its connection, and the ending of it once started."""

    conn: psycopg.AsyncConnection[Any]
    pid: int
    lease_token: uuid.UUID | None = None
    ending: asyncio.Task[None] | None = None


class AttemptRunner:
    """Executes attempts; ``terminate(pid)`` ends a backend from the scheduler's own connection.

    The watchdog costs a timer per attempt, and a task only when it has to act: past deadline + grace,
    or when ``cancel`` is set (then the running statement is cancelled, and the backend ended after the
    grace). statement_timeout can be trapped (EXCEPTION WHEN query_canceled) or outlived; termination
    from the scheduler's connection cannot, so an attempt never outlives its timeout (plus the grace),
    nor its lease: ``lose(token)`` ends it at once when lease renewal finds the lease gone (leases.py).
    """

    def __init__(self, terminate: Terminate, *, grace_s: float = 5.0):
        self.terminate = terminate
        self.grace_s = grace_s
        self._active: set[_Watched] = set()
        self._cancel_watch: asyncio.Task[None] | None = None
        self._cancel_event: asyncio.Event | None = None

    async def run(self, conn: psycopg.AsyncConnection[Any], job: JobDefinition, claim: Claim,
                  next_planned_ns: int | None, cancel: asyncio.Event, session_key: bytes,
                  tick_query: bytes | None = None) -> Outcome:
        """Run the attempt on ``conn`` (whose radix.attempt_session() is ``session_key``); never raises
        for failures of the procedure or the connection. With ``tick_query`` (engine/ticks.py) the
        attempt is that one-transaction tick, and ``claim`` stands for it (its token, no lease yet)."""
        atomic = not job.non_atomic
        started = time.monotonic()
        watched = _Watched(conn, conn.info.backend_pid, None if tick_query else claim.lease_token)
        self._active.add(watched)
        timer = asyncio.get_running_loop().call_later(job.deadline_ms / 1000 + self.grace_s, self._end,
                                                      watched, False)
        self._watch_cancel(cancel, watched)
        try:
            if tick_query is not None:
                outcome = await self._tick(conn, tick_query)
            elif atomic:
                outcome = await self._atomic(conn, job, claim, next_planned_ns, session_key)
                if outcome.sqlstate == NON_ATOMIC_SQLSTATE:
                    # the procedure controls transactions itself: nothing of it was kept; run it the
                    # only way PostgreSQL allows, as a top-level CALL in autocommit (at-least-once)
                    outcome = await self._non_atomic(conn, job, claim, next_planned_ns)
                    outcome.became_non_atomic = True
            else:
                outcome = await self._non_atomic(conn, job, claim, next_planned_ns)
        finally:
            timer.cancel()
            self._active.discard(watched)
            if watched.ending is not None:
                watched.ending.cancel()
        elapsed_ms = (time.monotonic() - started) * 1000
        outcome.deadline_expired = not outcome.succeeded and elapsed_ms >= job.deadline_ms
        outcome.cancel_requested = cancel.is_set()
        return outcome

    async def run_batch(self, conn: psycopg.AsyncConnection[Any], query: bytes, limit_s: float,
                        cancel: asyncio.Event) -> tuple[Outcome, psycopg.AsyncCursor[Any] | None]:
        """Run a batch of ticks (engine/batches.py) as one query; never raises for failures. Past
        ``limit_s`` the query is cancelled (and its backend ended after the grace), as on ``cancel``.
        Returns the outcome of the query as a whole and, when it succeeded, its cursor (``watch``)."""
        async with self.watch(conn, limit_s, cancel):
            return await self._query(conn, query)

    @contextlib.asynccontextmanager
    async def watch(self, conn: psycopg.AsyncConnection[Any], limit_s: float,
                    cancel: asyncio.Event) -> AsyncIterator[None]:
        """Bound what runs on ``conn`` inside the block: past ``limit_s``, or on ``cancel``, its statement is
        cancelled and its backend ended after the grace. A connection whose statement was being cancelled is
        closed at the end: the cancel may reach the backend after the statement ended on its own, and would
        cancel the next query sent there."""
        watched = _Watched(conn, conn.info.backend_pid)
        self._active.add(watched)
        timer = asyncio.get_running_loop().call_later(limit_s, self._end, watched, True)
        self._watch_cancel(cancel, watched)
        try:
            yield
        finally:
            timer.cancel()
            self._active.discard(watched)
            if watched.ending is not None:
                watched.ending.cancel()
                await conn.close()

    def hold(self, conn: psycopg.AsyncConnection[Any], token: uuid.UUID) -> bool:
        """The attempt running on ``conn`` now holds the lease ``token`` (a tick published as a lease), so
        ``lose(token)`` ends it. False when no attempt runs on ``conn``."""
        for watched in self._active:
            if watched.conn is conn:
                watched.lease_token = token
                return True
        return False

    def end(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """End the attempt running on ``conn`` now (its tick changed under it). False when none runs."""
        for watched in list(self._active):
            if watched.conn is conn:
                self._end(watched, False)
                return True
        return False

    def lose(self, token: uuid.UUID) -> bool:
        """The lease of the attempt holding ``token`` is gone: end its backend now. False when no
        attempt with that token is running here."""
        for watched in list(self._active):
            if watched.lease_token == token:
                self._end(watched, False)
                return True
        return False

    def close(self) -> None:
        """Stop watching for cancellation (the engine is closing)."""
        if self._cancel_watch is not None:
            self._cancel_watch.cancel()

    def _watch_cancel(self, cancel: asyncio.Event, watched: _Watched) -> None:
        """One task waits for ``cancel`` (the engine's, for its whole life), not one per attempt."""
        if cancel.is_set():
            self._end(watched, True)
        elif self._cancel_watch is None or self._cancel_watch.done() or cancel is not self._cancel_event:
            self.close()
            self._cancel_event = cancel
            self._cancel_watch = asyncio.create_task(self._on_cancel(cancel))

    async def _on_cancel(self, cancel: asyncio.Event) -> None:
        await cancel.wait()
        for watched in list(self._active):
            self._end(watched, True)

    def _end(self, watched: _Watched, cancelled: bool) -> None:
        """Start ending the attempt (once), unless it is over."""
        if watched in self._active and watched.ending is None:
            watched.ending = asyncio.create_task(self._ending(watched, cancelled))

    async def _ending(self, watched: _Watched, cancelled: bool) -> None:
        if cancelled:
            await watched.conn.cancel_safe(timeout=self.grace_s)
            await asyncio.sleep(self.grace_s)
        await self.terminate(watched.pid)

    async def _atomic(self, conn: psycopg.AsyncConnection[Any], job: JobDefinition, claim: Claim,
                      next_planned_ns: int | None, session_key: bytes) -> Outcome:
        """One simple query: the server stops at a failed statement, so the marker commits only with the
        procedure (and a DO block inside the transaction block is atomic: a COMMIT inside fails with
        2D000), and the clean runs only after a commit. A failure inside the block leaves it aborted
        (rolled back here); any other failure (at COMMIT, in the clean, or a broken connection) leaves
        the commit's fate unknown (in doubt): the engine reads the ledger."""
        assert job.call is not None
        return await self._one_query(conn, atomic_query(job.call, claim, job.deadline_ms, next_planned_ns,
                                                        session_key))

    async def _tick(self, conn: psycopg.AsyncConnection[Any], query: bytes) -> Outcome:
        """A lone tick's query: its outcome is run_tick's row, when the query went through."""
        outcome, cur = await self._query(conn, query)
        if cur is not None:
            row = await (await cur.set_result(TICK_ROW)).fetchone()
            outcome = (refusal(row) if row is not None else None) or outcome
            outcome.cleaned = await cleaned(cur)
        return outcome

    async def _one_query(self, conn: psycopg.AsyncConnection[Any], query: bytes) -> Outcome:
        outcome, cur = await self._query(conn, query)
        if cur is not None:
            outcome.cleaned = await cleaned(cur)
        return outcome

    async def _query(self, conn: psycopg.AsyncConnection[Any],
                     query: bytes) -> tuple[Outcome, psycopg.AsyncCursor[Any] | None]:
        """One transaction as one simple query, rolled back when it failed inside; a failure elsewhere (at
        COMMIT, in the clean, or a broken connection) is in doubt."""
        try:
            cur = await conn.execute(query, prepare=False)
        except psycopg.Error as exc:
            aborted = conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
            if aborted:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute(b"ROLLBACK", prepare=False)
            return self._failure(exc, atomic=True, in_doubt=not aborted), None
        return Outcome(succeeded=True, atomic=True, finalised=True), cur

    async def _non_atomic(self, conn: psycopg.AsyncConnection[Any], job: JobDefinition, claim: Claim,
                          next_planned_ns: int | None) -> Outcome:
        assert job.call is not None
        try:
            await conn.execute(BEGIN_NON_ATOMIC, (str(job.deadline_ms), claim.job_id, claim.lease_token))
            await conn.execute(ARGUMENTS_NON_ATOMIC, (claim.definition_version,))
            await conn.execute(job.call)
            await conn.execute(END_NON_ATOMIC, (claim.job_id, claim.lease_token, next_planned_ns))
        except psycopg.Error as exc:
            return self._failure(exc, atomic=False, in_doubt=False)
        return Outcome(succeeded=True, atomic=False, finalised=False)

    @staticmethod
    def _failure(exc: psycopg.Error, *, atomic: bool, in_doubt: bool) -> Outcome:
        """An Outcome for a failed statement; ``in_doubt`` when it may have failed after the commit."""
        message = exc.diag.message_primary or first_line(exc)
        return Outcome(succeeded=False, atomic=atomic, finalised=False, sqlstate=exc.sqlstate,
                       message=message, connection_lost=exc.sqlstate is None, in_doubt=in_doubt)
