"""The DocScheduler runner: CRON_TABLE tasks of one database, as their principals.

Shape of :class:`radixjobs.engine.Engine`: ``async with DocumentScheduler(dsn) as s: await s.run_due()``.

One check (the seed's reload + ``_processTask``) reads the ACTIVE tasks that are due or record a process
(``radix.doc_candidates``) and applies the pure decision table ``model.process_task`` to each:
- run / rerun: ``radix.doc_start`` creates the system process, fenced by the process the decision saw,
  so two schedulers never start one task twice; then the target runs (documents/targets.py: DB_FUNCTION on
  a connection logged in as the principal, CSP_SERVICE in a worker process), ``radix.doc_record`` records
  its outcome. Nothing runs when doc_start returns a refusal: RUN_AS no longer allowed, or (CSP_SERVICE)
  the service no longer granted to RUN_AS (``radix.grant_service``); the run then fails with that one-line
  text;
- finish (documents/finish.py, the seed's ``_finishTask``): ``model.plan_finish`` counts errors, the next
  time is evaluated as the principal (``expression.evaluate``), ``radix.doc_finish`` writes it all in one
  transaction, fenced by the process and the document version (a concurrent edit makes it decide again).

Invariants:
- one task is worked on by at most one of this scheduler's asyncio tasks at a time (``_busy``), and by one
  scheduler of all nodes (the fences of radix.doc_start and radix.doc_finish);
- at most ``concurrency`` runs at once (``_slots``); one task's failure is logged and recorded as
  ``last_error``, never stops the scheduler;
- a process of this node's counts as live exactly while it is in ``_in_flight`` (radix.doc_candidates): one
  left from a previous life of the node is taken for lost and its task run again;
- the counters are the fixed set ``COUNTER_KEYS``.

Fairness (radixjobs.fairness): runs are started round-robin among the tasks' principals (RUN_AS), and a
principal with ``max_per_principal`` runs started or waiting for a slot on this node gets no more.

Time: ``clock`` (a callable returning an aware datetime) is the scheduler's "now" for due checks, the
documents' maintained times and the expressions' now(); None means the database clock.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from radixjobs.db import POOL_OPEN_TIMEOUT_S, abound_lock_waits, scheduler_dsn
from radixjobs.documents import model
from radixjobs.documents.finish import REFUSAL_RETRY_S, Finisher
from radixjobs.documents.model import Candidate, Started
from radixjobs.documents.services import ServiceRegistry, ServiceSpec
from radixjobs.documents.targets import TargetRunner
from radixjobs.engine.nodes import default_node_id, register_node
from radixjobs.engine.principals import PrincipalPools
from radixjobs.fairness import fair_order, principal_cap
from radixjobs.migrate import NOTIFY_QUEUE_LIMIT

if TYPE_CHECKING:
    from radixjobs.documents.observer import Observer

log = logging.getLogger("radixjobs.documents")

Clock = Callable[[], dt.datetime]
COUNTER_KEYS: Final = ("doc_runs", "doc_successes", "doc_failures", "doc_passive", "doc_errors", "doc_restarts")
MAX_ROUNDS: Final = 100
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
        self.node_id = node_id or f"{default_node_id()}:docs"
        self.registry = ServiceRegistry(services, entry_points=entry_points)  # replaced on reload (SIGHUP)
        self.clock = clock
        self.check_period_s = check_period_s
        self.reload_period_s = reload_period_s
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
        self._targets = TargetRunner(self._pool, self._principals, db_timeout_s=db_timeout_s,
                                     service_timeout_s=service_timeout_s)
        self._finisher = Finisher(self._pool, self._principals, self.counters, refusal_retry_s=refusal_retry_s,
                                  expression_timeout_ms=expression_timeout_ms)
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
            self._targets.stop_workers.set()
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
                error = await self._targets.run(started, c.num, self.registry, rerun=action is model.Action.RERUN)
                self.counters["doc_failures" if error else "doc_successes"] += 1
                if error:
                    self._error(c.num, started.process_id, error)
                finished_at = await self._record(started.process_id, error)
                if finished_at is not None:
                    await self._finisher.finish(c.num, started.process_id, error, finished_at, finished_at)
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
        return await self._finisher.finish(c.num, c.sys_process_id, error, None, c.now)


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
