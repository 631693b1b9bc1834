"""The DocScheduler runner: CRON_TABLE tasks of one database, as their principals.

Shape of :class:`radixjobs.engine.Engine`: ``async with DocumentScheduler(dsn) as s: await s.run_due()``.

One check (the seed's reload + ``_processTask``) reads the ACTIVE tasks that are due or record a process
(``radix.doc_candidates``) and applies the pure decision table ``model.process_task`` to each:
- run / rerun: ``radix.doc_start`` creates the system process, fenced by the process the decision saw,
  so two schedulers never start one task twice; then the target runs (DB_FUNCTION on a connection
  logged in as the principal, CSP_SERVICE in a worker process), ``radix.doc_record`` records its outcome.
  Nothing runs when doc_start returns a refusal: RUN_AS no longer allowed, or (CSP_SERVICE) the service no
  longer granted to RUN_AS (``radix.grant_service``); the run then fails with that one-line text;
- finish (the seed's ``_finishTask``): ``model.plan_finish`` counts errors, the next time is evaluated
  as the principal (``expression.evaluate``), ``radix.doc_finish`` writes it all in one transaction,
  fenced by the process and the document version (a concurrent edit makes it decide again).

Fairness (radixjobs.fairness): runs are started round-robin among the tasks' principals (RUN_AS), and a
principal with ``max_per_principal`` runs started or waiting for a slot on this node gets no more.

Time: ``clock`` (a callable returning an aware datetime) is the scheduler's "now" for due checks, the
documents' maintained times and the expressions' now(); None means the database clock.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from radixjobs import retry
from radixjobs.db import POOL_OPEN_TIMEOUT_S, abound_lock_waits, scheduler_dsn
from radixjobs.documents import expression, model
from radixjobs.documents.model import Candidate, Started
from radixjobs.documents.services import ServiceRegistry, ServiceSpec
from radixjobs.documents.services import call as call_service
from radixjobs.engine.definitions import dollar_quoted
from radixjobs.engine.nodes import register_node
from radixjobs.engine.principals import PrincipalPools
from radixjobs.engine.runner import default_node_id
from radixjobs.fairness import fair_order, principal_cap
from radixjobs.migrate import NOTIFY_QUEUE_LIMIT

if TYPE_CHECKING:
    from radixjobs.observe import Observer

log = logging.getLogger("radixjobs.documents")

Clock = Callable[[], dt.datetime]
COUNTER_KEYS: Final = ("doc_runs", "doc_successes", "doc_failures", "doc_passive", "doc_errors", "doc_restarts")
MAX_ROUNDS: Final = 100
# A run started again because its node died may find the killed run's backend still executing the
# DB_FUNCTION (an orphaned backend notices its client is gone within client_connection_check_interval).
# The call carries the task in a comment (RUN_TAG, the NUM in hex), and a rerun waits until no backend of
# the principal is still running a call so tagged, so two runs of one task never overlap. Only sessions
# logged in as the principal can look like that; no lock another role could take is involved.
RUN_TAG: Final = "/* radixjobs task {} */"
STILL_RUNNING: Final = ("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE usename = %s AND state <> 'idle' "
                        "AND query LIKE %s)")
RERUN_POLL_S: Final = 0.05
# The kind of routine a DB_FUNCTION names, callable with no arguments (every parameter defaulted): in its
# schema, or else the first schema of the session's path that has one (as PostgreSQL resolves the call,
# which also refuses an ambiguous one). Sent on the principal's connection: every name qualified.
ZERO_ARGUMENT_ROUTINE: Final = (
    "SELECT p.prokind FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n "
    "ON n.oid OPERATOR(pg_catalog.=) p.pronamespace "
    "WHERE p.proname OPERATOR(pg_catalog.=) %s::pg_catalog.name "
    "AND p.pronargs OPERATOR(pg_catalog.-) p.pronargdefaults OPERATOR(pg_catalog.=) 0 "
    "AND CASE WHEN %s::pg_catalog.name IS NULL "
    "THEN n.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(true)) "
    "ELSE n.nspname OPERATOR(pg_catalog.=) %s::pg_catalog.name END "
    "ORDER BY pg_catalog.array_position(pg_catalog.current_schemas(true), n.nspname), "
    "p.prokind OPERATOR(pg_catalog.<>) 'f' LIMIT 1")
# A task whose next time cannot be evaluated because RUN_AS cannot log in now (NOLOGIN) is tried again
# after this long; the failed run counts towards MAX_COUNT_ERROR.
REFUSAL_RETRY_S: Final = 60.0
# While the notification queue is half full or more, document changes send no wake-up (radix._hint skips
# it, so a full queue never fails a write): the scheduler then looks this often instead of every check
# period, so a change is still picked up within about a second.
HINTLESS_CHECK_S: Final = 1.0
# radix.doc_candidates in its own order, with each task's principal (for the fairness of the runs)
CANDIDATES: Final = ("SELECT d.*, c.principal_oid FROM radix.doc_candidates(%s, %s, %s::bigint[]) WITH ORDINALITY d "
                     "LEFT JOIN radix.cron_table c ON c.num OPERATOR(pg_catalog.=) d.num ORDER BY d.ordinality")


class DocumentScheduler:
    """Runs the CRON_TABLE tasks of one database."""

    def __init__(self, dsn: str, *, node_id: str | None = None,
                 services: Mapping[str, ServiceSpec] | None = None, entry_points: bool = True,
                 clock: Clock | None = None, concurrency: int = 8, check_period_s: float = 30.0,
                 reload_period_s: float = 600.0, db_timeout_s: float = 240.0, service_timeout_s: float = 300.0,
                 expression_timeout_ms: int = 1000, hold_node_lock: bool = True, grace_s: float = 10.0,
                 max_per_principal: int | None = None, refusal_retry_s: float = REFUSAL_RETRY_S):
        self.dsn = scheduler_dsn(dsn)
        self.refusal_retry_s = refusal_retry_s
        self.node_id = node_id or f"{default_node_id()}:docs"
        self.registry = ServiceRegistry(services, entry_points=entry_points)
        self.clock = clock
        self.check_period_s = check_period_s
        self.reload_period_s = reload_period_s
        self.db_timeout_s = db_timeout_s
        self.service_timeout_s = service_timeout_s
        self.expression_timeout_ms = expression_timeout_ms
        self.hold_node_lock = hold_node_lock
        self.grace_s = grace_s
        self.counters: Counter[str] = Counter(dict.fromkeys(COUNTER_KEYS, 0))
        self.last_error: dict[str, Any] | None = None
        self.cancel = asyncio.Event()
        self.hints_skipped = False  # the last look found the NOTIFY queue too full for wake-ups
        self._pool = AsyncConnectionPool(self.dsn, min_size=1, max_size=4, open=False,
                                         kwargs={"autocommit": True}, name="radix-documents",
                                         configure=abound_lock_waits)
        self._principals = PrincipalPools(dsn, max_idle=concurrency)
        self._control: psycopg.AsyncConnection[Any] | None = None
        self._slots = asyncio.Semaphore(concurrency)
        self._busy: set[str] = set()
        self.max_per_principal = principal_cap(concurrency, max_per_principal)
        self._principal_of: dict[str, int] = {}  # task -> its RUN_AS role's oid, as of the last check
        self._runs_of: Counter[int] = Counter()  # principal oid -> runs started or waiting for a slot
        self._in_flight: set[int] = set()
        self._tasks: set[asyncio.Task[bool]] = set()
        self._stop_workers = threading.Event()
        self.observer: Observer | None = None  # spans of the runs (radixjobs.observe)

    async def __aenter__(self) -> DocumentScheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open connections and register this node (alive while its control session is), unless it
        shares the node of an Engine of this process (hold_node_lock=False)."""
        if self.hold_node_lock:  # first: a direct connection fails at once when no server is there
            self._control = await register_node(self.dsn, self.node_id)
        try:
            await self._pool.open(wait=True, timeout=POOL_OPEN_TIMEOUT_S)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop service workers, wait (bounded) for running tasks, close every connection."""
        self.cancel.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=self.grace_s)
            self._stop_workers.set()
            for task in pending:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._principals.close()
        await self._pool.close()
        if self._control is not None:
            await self._control.close()
            self._control = None

    # -- verbs -----------------------------------------------------------------------------------------
    async def run_due(self) -> int:
        """Run (to the end) everything due now, finish recorded processes; returns the runs started."""
        before = self.counters["doc_runs"]
        for _ in range(MAX_ROUNDS):
            tasks = await self.check()
            if not tasks or not any(await asyncio.gather(*tasks)):
                break
        return self.counters["doc_runs"] - before

    async def check(self) -> list[asyncio.Task[bool]]:
        """One pass of the decision table; starts the work it decides on (tasks return "progressed")."""
        started = []
        candidates = await self._candidates()
        for c in fair_order(candidates, lambda c: self._principal_of.get(c.num, 0), self._runs_of):
            if c.num in self._busy:
                continue
            action = model.process_task(c.now, c.due_at, c.sys_process_id, c.process)
            work: Awaitable[bool]
            if action in (model.Action.RUN, model.Action.RERUN):
                principal = self._principal_of.get(c.num, 0)
                if self.max_per_principal and self._runs_of[principal] >= self.max_per_principal:
                    continue  # at its cap: looked at again when one of its runs ends
                self._runs_of[principal] += 1
                work = self._counted(principal, self._run(c, action))
            elif action in (model.Action.FINISH_OK, model.Action.FINISH_ERROR):
                work = self._finish_recorded(c, action)
            else:
                continue
            self._busy.add(c.num)
            task = asyncio.create_task(self._guard(c.num, work))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started.append(task)
        return started

    async def next_due_in(self) -> float | None:
        """Seconds until the earliest task is due (0: now), or None when nothing is planned."""
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT radix.doc_next_due_in(%s, %s, %s::bigint[]), "
                                     "pg_catalog.pg_notification_queue_usage()",
                                     (self._at(), self.node_id, list(self._in_flight)))
            row = await cur.fetchone()
        self.hints_skipped = bool(row and row[1] is not None and row[1] >= NOTIFY_QUEUE_LIMIT)
        return None if row is None or row[0] is None else float(row[0])

    async def reload(self) -> int:
        """Full reload housekeeping: release tasks no longer ACTIVE whose process ended or was lost."""
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT radix.doc_release_inactive(%s, %s::bigint[], %s)",
                                     (self.node_id, list(self._in_flight), self._at()))
            row = await cur.fetchone()
        return int(row[0]) if row and row[0] else 0

    async def serve(self, stop: asyncio.Event | None = None) -> None:
        """Run until ``stop`` (default: ``self.cancel``): woken by NOTIFY, the next NEXT_RUN, the check period."""
        stop = stop or self.cancel
        wake = asyncio.Event()
        listener: asyncio.Task[None] | None = None
        last_reload = float("-inf")
        try:
            while not stop.is_set():
                if listener is None or listener.done():
                    listener = asyncio.create_task(self._listen(wake))
                wake.clear()
                try:
                    if time.monotonic() - last_reload >= self.reload_period_s:
                        await self.reload()
                        last_reload = time.monotonic()
                    await self.check()
                    due = await self.next_due_in()
                except psycopg.Error as exc:  # the database is away: try again after a check period
                    log.warning("document check failed node=%s error=%s", self.node_id, exc)
                    self._error("", None, str(exc).strip().splitlines()[0] if str(exc).strip() else "error")
                    due = None
                timeout = min(self.check_period_s, self.reload_period_s - (time.monotonic() - last_reload),
                              HINTLESS_CHECK_S if self.hints_skipped else float("inf"))
                wait = max(0.0, timeout if due is None else min(due, timeout))
                # "due now" yet untouched by this check: being finished here; never spin on it
                await _wait_any((wake, stop), wait if wait > 0 else 0.25)
        finally:
            if listener is not None:
                listener.cancel()
                await asyncio.gather(listener, return_exceptions=True)

    async def run_for(self, seconds: float) -> int:
        """Serve for ``seconds``; returns the runs started."""
        before = self.counters["doc_runs"]
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        await self.serve(stop)
        return self.counters["doc_runs"] - before

    async def _listen(self, wake: asyncio.Event) -> None:
        """Set ``wake`` on every radix_documents notification, until cancelled or the connection drops."""
        try:
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                await conn.execute("LISTEN radix_documents")
                wake.set()  # anything changed before LISTEN: look once more
                async for _ in conn.notifies():
                    wake.set()
        except psycopg.Error as exc:
            log.warning("document notifications lost node=%s error=%s", self.node_id, exc)
            await asyncio.sleep(1.0)  # the serve loop reconnects; never in a tight loop

    # -- one task ----------------------------------------------------------------------------------------
    async def _counted(self, principal: int, work: Awaitable[bool]) -> bool:
        try:
            return await work
        finally:
            self._runs_of[principal] -= 1
            if self._runs_of[principal] <= 0:
                del self._runs_of[principal]

    async def _guard(self, num: str, work: Awaitable[bool]) -> bool:
        try:
            return await work
        except Exception as exc:  # one task's trouble never stops the scheduler
            log.exception("document task failed num=%s node=%s", num, self.node_id)
            self._error(num, None, f"{type(exc).__name__}: {exc}")
            return False
        finally:
            self._busy.discard(num)

    async def _run(self, c: Candidate, action: model.Action) -> bool:
        async with self._slots:
            started = await self._start(c)
            if started is None:
                return False
            self.counters["doc_runs"] += 1
            if action is model.Action.RERUN:
                self.counters["doc_restarts"] += 1
            self._in_flight.add(started.process_id)
            began = time.monotonic()
            try:
                log.info("document run start num=%s process=%s kind=%s target=%s node=%s", c.num,
                         started.process_id, started.kind, started.target, self.node_id)
                error = await self._execute(started, c.num, rerun=action is model.Action.RERUN)
                self.counters["doc_failures" if error else "doc_successes"] += 1
                if error:
                    self._error(c.num, started.process_id, error)
                finished_at = await self._record(started.process_id, error)
                if finished_at is not None:
                    await self._finish(c.num, started.process_id, error, finished_at, finished_at)
                log.info("document run end num=%s process=%s node=%s outcome=%s", c.num, started.process_id,
                         self.node_id, "failed" if error else "completed")
                if self.observer is not None:
                    self.observer.document_run(c.num, started, error, began, action is model.Action.RERUN,
                                               self._principals)
            finally:
                self._in_flight.discard(started.process_id)
            return True

    async def _finish_recorded(self, c: Candidate, action: model.Action) -> bool:
        """Finish a process that ended without its task being finished (a node stopped in between)."""
        assert c.sys_process_id is not None
        assert c.process is not None
        error = None if action is model.Action.FINISH_OK else (c.process.error_text or "the process failed")
        return await self._finish(c.num, c.sys_process_id, error, None, c.now)

    async def _finish(self, num: str, process_id: int, error: str | None, end_at: dt.datetime | None,
                      now: dt.datetime) -> bool:
        """Write the finish; retried when the document changed meanwhile. False when nothing was written."""
        for _ in range(5):
            async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                await cur.execute("SELECT * FROM radix.doc_finish_state(%s, %s)", (num, process_id))
                state = await cur.fetchone()
            if state is None:
                return False
            plan = model.plan_finish(state["props"], state["count_error"], error)
            next_time, reason = await self._next_time(plan, state, now)
            retry_at = now + dt.timedelta(seconds=self.refusal_retry_s) if model.may_pass(reason) else None
            settled = model.settle(plan, now, next_time, reason, retry_at=retry_at)
            async with self._pool.connection() as conn:
                cur2 = await conn.execute(
                    "SELECT radix.doc_finish(%s, %s, %s, %s, %s, %s, %s, %s)",
                    (num, process_id, state["version"], str(settled.status), settled.next_run, plan.count_error,
                     settled.error_text, end_at or state["process_finished_at"] or now))
                row = await cur2.fetchone()
            verdict = row[0] if row else "lost"
            if verdict == "stale":
                continue
            if verdict == "done" and state["status"] == model.Status.ACTIVE:
                if settled.status is model.Status.PASSIVE:
                    self.counters["doc_passive"] += 1
                elif settled.status is model.Status.ERROR:
                    self.counters["doc_errors"] += 1
            return verdict == "done"
        return False

    async def _next_time(self, plan: model.FinishPlan, state: dict[str, Any],
                         now: dt.datetime) -> tuple[dt.datetime | None, str | None]:
        """The evaluated next time, or the reason there is none. Connection trouble raises (finish later)."""
        if plan.expression_name is None:
            return None, None
        empty = model.empty_expression_reason(plan)
        if empty is not None:
            return None, empty
        try:
            checked = expression.check(plan.expression_text)
        except expression.ExpressionRefused as exc:
            return None, f"refused: {exc}"
        if state["refusal"]:
            return None, f"{model.RUN_AS_REFUSED}: {state['refusal']}"
        try:
            async with self._principals.connection(state["principal"]) as conn:
                value = await expression.evaluate(conn, checked, now, timeout_ms=self.expression_timeout_ms)
        except expression.EvaluationFailed as exc:
            return None, f"evaluation failed: {exc}"
        except psycopg.OperationalError as exc:
            text = expression.db_error_text(exc)
            if retry.classify(exc.sqlstate, text).category is not retry.Category.SECURITY:
                raise  # the database is away: finished by a later check
            return None, f"{model.RUN_AS_REFUSED}: {text}"
        return value, None

    async def _execute(self, started: Started, num: str, *, rerun: bool) -> str | None:
        """Run the target; the one-line error, or None on success."""
        if started.refusal:
            return started.refusal
        if started.kind == "csp":
            outcome = await call_service(self.registry, started.target, started.params,
                                          timeout_s=self.service_timeout_s, cancel=self._stop_workers)
            return outcome.error
        parts = model.parse_function_name(started.target)
        if parts is None:
            return f"DB_FUNCTION {started.target!r} is not a function name"
        if rerun and await self._previous_run_still_running(started.principal, num):
            return (f"the previous run of task {num} was still running after {self.db_timeout_s:g} s "
                    "(its node is gone, its session is not)")
        try:
            async with self._principals.connection(started.principal) as conn:
                return await self._call_function(conn, parts, num)
        except psycopg.OperationalError as exc:  # the login failed, or the session was lost
            return expression.db_error_text(exc, prefix=f"RUN_AS {started.principal}: ")

    async def _previous_run_still_running(self, principal: str, num: str) -> bool:
        """Wait (up to db_timeout_s) until no session of ``principal`` runs a call tagged for task ``num``;
        True when one still does."""
        pattern = "%" + RUN_TAG.format(num.encode().hex()) + "%"
        deadline = time.monotonic() + self.db_timeout_s
        while True:
            async with self._pool.connection() as conn:
                cur = await conn.execute(STILL_RUNNING, (principal, pattern))
                row = await cur.fetchone()
            if not (row and row[0]):
                return False
            if time.monotonic() >= deadline:
                return True
            await asyncio.sleep(RERUN_POLL_S)

    async def _call_function(self, conn: psycopg.AsyncConnection[Any], parts: tuple[str, ...],
                             num: str) -> str | None:
        """PERFORM f() or CALL p() in a DO block, by what the name is; bounded by db_timeout_s (then the
        backend is ended)."""
        quoted = ".".join('"' + p.replace('"', '""') + '"' for p in parts)
        schema, name = (None, parts[0]) if len(parts) == 1 else parts
        try:
            cur = await conn.execute(ZERO_ARGUMENT_ROUTINE, (name, schema, schema))
            row = await cur.fetchone()
        except psycopg.Error as exc:
            return expression.db_error_text(exc)
        if row is None:
            return f"[42883] function {quoted}() does not exist (DB_FUNCTION is called without arguments)"
        if row[0] not in ("f", "p"):
            return f"[42809] {quoted}() is an aggregate or window function"
        # in a DO block, so that nothing the routine returns (a result, a set, an INOUT value) reaches us
        inner = sql.SQL("BEGIN CALL {}(); END" if row[0] == "p" else "BEGIN PERFORM {}(); END").format(
            sql.Identifier(*parts)).as_string(None)
        verb = sql.SQL("DO " + dollar_quoted(inner, "radix_do") + " " + RUN_TAG.format(num.encode().hex()))
        pid = conn.info.backend_pid
        call = asyncio.create_task(conn.execute(verb))
        try:
            done, _ = await asyncio.wait({call}, timeout=self.db_timeout_s)
        except asyncio.CancelledError:  # shutting down: never leave the call running behind us
            await self._terminate(pid, call)
            raise
        if not done:
            await self._terminate(pid, call)
            return f"DB_FUNCTION timed out after {self.db_timeout_s:g} s: its session was ended"
        try:
            call.result()
        except psycopg.Error as exc:
            return expression.db_error_text(exc)
        return None

    async def _terminate(self, pid: int, call: asyncio.Task[Any]) -> None:
        """End a principal backend from the scheduler's own connection, and wait for its call to fail."""
        async with self._pool.connection() as control:
            await control.execute("SELECT pg_catalog.pg_terminate_backend(%s::pg_catalog.int4)", (pid,))
        await asyncio.gather(call, return_exceptions=True)

    # -- database round trips ----------------------------------------------------------------------------
    def _at(self) -> dt.datetime | None:
        return self.clock() if self.clock is not None else None

    async def _candidates(self) -> list[Candidate]:
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(CANDIDATES, (self._at(), self.node_id, list(self._in_flight)))
            rows = await cur.fetchall()
        self._principal_of = {r["num"]: int(r["principal_oid"] or 0) for r in rows}
        return [Candidate(r["num"], r["version"], r["due_at"], r["sys_process_id"],
                          None if r["process_status"] is None else
                          model.ProcessState(r["process_status"], bool(r["process_live"]), r["process_error"]),
                          r["now_ts"]) for r in rows]

    async def _start(self, c: Candidate) -> Started | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT * FROM radix.doc_start(%s, %s, %s, %s)",
                                     (c.num, c.sys_process_id, self.node_id, self._at()))
            row = await cur.fetchone()
        return None if row is None else Started(*row)

    async def _record(self, process_id: int, error: str | None) -> dt.datetime | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT radix.doc_record(%s, %s, %s, %s)",
                                     (process_id, error is None, error, self._at()))
            row = await cur.fetchone()
        return row[0] if row else None

    def _error(self, num: str, process_id: int | None, error: str) -> None:
        self.last_error = {"num": num, "process_id": process_id, "error": error, "node": self.node_id}


async def _wait_any(events: tuple[asyncio.Event, ...], seconds: float) -> None:
    """Return when one of ``events`` is set or after ``seconds``."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
