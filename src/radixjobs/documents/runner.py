"""CRON_TABLE tasks as work of the engine (engine/work.py): ``Engine(dsn, work=Documents())`` runs the tasks of
its database in its own slots, beside its jobs, as their principals.

One look (the seed's reload + ``_processTask``) reads the ACTIVE tasks that are due or record a process
(``radix.doc_candidates``) and applies the pure decision table ``model.process_task`` to each:
- run / rerun: ``radix.doc_start`` creates the system process, fenced by the process the decision saw,
  so two nodes never start one task twice; then the target runs (documents/targets.py: DB_FUNCTION on a
  connection logged in as the principal under the engine's watchdog, CSP_SERVICE in a worker process),
  ``radix.doc_record`` records its outcome. Nothing runs when doc_start returns a refusal: RUN_AS no longer
  allowed, or (CSP_SERVICE) the service no longer granted to RUN_AS (``radix.grant_service``); the run then
  fails with that one-line text;
- finish (documents/finish.py, the seed's ``_finishTask``): ``model.plan_finish`` counts errors, the next
  time is evaluated as the principal (``expression.evaluate``), ``radix.doc_finish`` writes it all in one
  transaction, fenced by the process and the document version (a concurrent edit makes it decide again).

Invariants:
- every run, and every finish of a run that ended without one, is an item of the engine (engine/work.py):
  it holds one of the engine's slots and counts for its principal under the engine's cap, so
  ``--concurrency`` bounds jobs and documents together and ``--max-per-principal`` means one thing;
- one task is worked on by at most one item of this engine at a time (``_busy``), and by one node of all
  (the fences of radix.doc_start and radix.doc_finish); processes carry the engine's node id, alive while
  the engine's registration is (radix.node_alive);
- a process of this node's counts as live exactly while it is in ``_in_flight`` (radix.doc_candidates): one
  left from a previous life of the node is taken for lost and its task run again;
- one task's failure is logged and recorded as ``last_error``, never stops the engine;
- the counters are the fixed set ``COUNTER_KEYS``, kept in the engine's counters.

Fairness (radixjobs.fairness): runs are dealt round-robin among the tasks' principals (RUN_AS), fewest
running first (this engine's ticks and runs, exactly, plus the principal's attempts elsewhere as the
finder counts them for ticks), none to a principal at the engine's cap: one cap, one count, jobs and
documents together.

Time: ``clock`` (a callable returning an aware datetime) is the documents' "now" for due checks, the
maintained times and the expressions' now(); None means the database clock.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from psycopg.rows import dict_row

from radixjobs.documents import model
from radixjobs.documents.finish import REFUSAL_RETRY_S, Finisher
from radixjobs.documents.model import Candidate, Started
from radixjobs.documents.services import ServiceRegistry, ServiceSpec
from radixjobs.documents.targets import TargetRunner
from radixjobs.engine.work import Work, WorkContext
from radixjobs.fairness import fair_order
from radixjobs.migrate import NOTIFY_QUEUE_LIMIT

if TYPE_CHECKING:
    from radixjobs.documents.observer import Observer

log = logging.getLogger("radixjobs.documents")

Clock = Callable[[], dt.datetime]
COUNTER_KEYS: Final = ("doc_runs", "doc_successes", "doc_failures", "doc_passive", "doc_errors", "doc_restarts")
# While the notification queue is half full or more, document changes send no wake-up (radix._hint skips
# it, so a full queue never fails a write): the documents are then looked at this often instead of every
# check period, so a change is still picked up within about a second.
HINTLESS_CHECK_S: Final = 1.0
# A task due now that a look left (its principal at its cap, or being finished here) is looked at again
# after this long, or when one of this engine's items ends: never a busy loop.
UNTAKEN_RECHECK_S: Final = 0.25
# radix.doc_candidates in its own order, with each task's principal and that principal's attempts running
# elsewhere (other nodes' leases and runs, sessions not this engine's: radix._running_elsewhere, as the
# finder counts them for ticks), for the fairness of the runs; then the seconds until the next task is due
# and how full the notification queue is, in the same round trip
CANDIDATES: Final = ("SELECT d.*, c.principal_oid, coalesce(e.running, 0) AS elsewhere "
                     "FROM radix.doc_candidates(%s, %s, %s::bigint[]) WITH ORDINALITY d "
                     "LEFT JOIN radix.cron_table c ON c.num OPERATOR(pg_catalog.=) d.num "
                     "LEFT JOIN radix._running_elsewhere(%s, %s::integer[]) e "
                     "ON e.principal OPERATOR(pg_catalog.=) c.principal_oid ORDER BY d.ordinality")
NEXT_DUE: Final = ("SELECT radix.doc_next_due_in(%s, %s, %s::bigint[]), "
                   "pg_catalog.pg_notification_queue_usage()")


class Documents:
    """The CRON_TABLE tasks of one database, as a source of the engine's work."""

    def __init__(self, *, services: Mapping[str, ServiceSpec] | None = None, entry_points: bool = True,
                 clock: Clock | None = None, check_period_s: float = 30.0, reload_period_s: float = 600.0,
                 db_timeout_s: float = 240.0, service_timeout_s: float = 300.0, expression_timeout_ms: int = 1000,
                 refusal_retry_s: float = REFUSAL_RETRY_S):
        self.registry = ServiceRegistry(services, entry_points=entry_points)  # replaced on reload (SIGHUP)
        self.clock = clock
        self.check_period_s = check_period_s
        self.reload_period_s = reload_period_s
        self.db_timeout_s = db_timeout_s
        self.service_timeout_s = service_timeout_s
        self.expression_timeout_ms = expression_timeout_ms
        self.refusal_retry_s = refusal_retry_s
        self.counters: Counter[str] = Counter(dict.fromkeys(COUNTER_KEYS, 0))  # the engine's, once bound
        self.last_error: dict[str, Any] | None = None
        self.hints_skipped = False  # the last look found the NOTIFY queue too full for wake-ups
        self.observer: Observer | None = None  # spans of the runs (radixjobs.observe)
        self.node_id = ""
        self._context: WorkContext | None = None
        self._targets: TargetRunner | None = None
        self._finisher: Finisher | None = None
        self._busy: set[str] = set()
        self._in_flight: set[int] = set()
        self._look_at = 0.0  # time.monotonic() of the next look (0: at once)
        self._last_reload = float("-inf")
        self._stopper: asyncio.Task[None] | None = None

    # -- the engine's side (engine/work.py) ------------------------------------------------------------
    def bind(self, context: WorkContext) -> None:
        self._context = context
        self.node_id = context.node_id
        for key in COUNTER_KEYS:
            context.counters[key] += self.counters[key]
        self.counters = context.counters
        self._targets = TargetRunner(context.pool, context.principals, context.watch,
                                     db_timeout_s=self.db_timeout_s, service_timeout_s=self.service_timeout_s)
        self._finisher = Finisher(context.pool, context.principals, self.counters,
                                  refusal_retry_s=self.refusal_retry_s,
                                  expression_timeout_ms=self.expression_timeout_ms)
        self._stopper = asyncio.create_task(self._stop_workers_on(context.cancel))

    async def look(self, limit: int, running: Mapping[int, int], cap: int) -> list[Work]:
        """The runs and finishes due now, dealt fairly among the principals (full reload housekeeping first,
        every ``reload_period_s``)."""
        if time.monotonic() - self._last_reload >= self.reload_period_s:
            await self.reload()
            self._last_reload = time.monotonic()
        candidates, principal_of, elsewhere, due = await self._candidates()
        held: Counter[int] = Counter(running)
        held.update(elsewhere)
        items: list[Work] = []
        left = False  # a task due now was not taken
        for c in fair_order(candidates, lambda c: principal_of.get(c.num, 0), held):
            if c.num in self._busy:
                continue
            action = model.process_task(c.now, c.due_at, c.sys_process_id, c.process)
            if action not in (model.Action.RUN, model.Action.RERUN, model.Action.FINISH_OK,
                              model.Action.FINISH_ERROR):
                continue
            principal = principal_of.get(c.num, 0)
            if len(items) >= limit or (cap and held[principal] >= cap):
                left = True  # at its cap: looked at again when one of its runs ends
                continue
            held[principal] += 1
            self._busy.add(c.num)
            work = (self._run(c, action) if action in (model.Action.RUN, model.Action.RERUN)
                    else self._finish_recorded(c, action))
            items.append(Work(principal, functools.partial(self._guard, c.num, work)))
        self._plan_next_look(due, left)
        return items

    def due_in(self) -> float | None:
        return max(0.0, self._look_at - time.monotonic())

    def poke(self) -> None:
        self._look_at = 0.0

    async def close(self) -> None:
        if self._targets is not None:
            self._targets.stop_workers.set()
        if self._stopper is not None:
            self._stopper.cancel()
            await asyncio.gather(self._stopper, return_exceptions=True)

    # -- verbs -----------------------------------------------------------------------------------------
    async def next_due_in(self) -> float | None:
        """Seconds until the earliest task is due (0: now), or None when nothing is planned."""
        async with self._pool().connection() as conn:
            cur = await conn.execute(NEXT_DUE, (self._at(), self.node_id, list(self._in_flight)))
            row = await cur.fetchone()
        return None if row is None or row[0] is None else float(row[0])

    async def reload(self) -> int:
        """Full reload housekeeping: release tasks no longer ACTIVE whose process ended or was lost."""
        async with self._pool().connection() as conn:
            cur = await conn.execute("SELECT radix.doc_release_inactive(%s, %s::bigint[], %s)",
                                     (self.node_id, list(self._in_flight), self._at()))
            row = await cur.fetchone()
        return int(row[0]) if row and row[0] else 0

    # -- one task ----------------------------------------------------------------------------------------
    async def _guard(self, num: str, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as exc:  # one task's trouble never stops the engine
            log.exception("document task failed num=%s node=%s", num, self.node_id)
            self._error(num, None, f"{type(exc).__name__}: {exc}")
        finally:
            self._busy.discard(num)
            self._look_at = 0.0  # what it held (a slot, its principal's share) may let another run

    async def _run(self, c: Candidate, action: model.Action) -> None:
        assert self._targets is not None
        assert self._finisher is not None
        started = await self._start(c)
        if started is None:
            return
        rerun = action is model.Action.RERUN
        self.counters["doc_runs"] += 1
        if rerun:
            self.counters["doc_restarts"] += 1
        self._in_flight.add(started.process_id)
        began = time.monotonic()
        try:
            log.info("document run start num=%s process=%s kind=%s target=%s node=%s", c.num,
                     started.process_id, started.kind, started.target, self.node_id)
            error = await self._targets.run(started, c.num, self.registry, rerun=rerun)
            self.counters["doc_failures" if error else "doc_successes"] += 1
            if error:
                self._error(c.num, started.process_id, error)
            finished_at = await self._record(started.process_id, error)
            if finished_at is not None:
                await self._finisher.finish(c.num, started.process_id, error, finished_at, finished_at)
            log.info("document run end num=%s process=%s node=%s outcome=%s", c.num, started.process_id,
                     self.node_id, "failed" if error else "completed")
            if self.observer is not None and self._context is not None:
                self.observer.document_run(c.num, started, error, began, rerun, self._context.principals)
        finally:
            self._in_flight.discard(started.process_id)

    async def _finish_recorded(self, c: Candidate, action: model.Action) -> None:
        """Finish a process that ended without its task being finished (a node stopped in between)."""
        assert self._finisher is not None
        assert c.sys_process_id is not None
        assert c.process is not None
        error = None if action is model.Action.FINISH_OK else (c.process.error_text or "the process failed")
        await self._finisher.finish(c.num, c.sys_process_id, error, None, c.now)

    async def _stop_workers_on(self, cancel: asyncio.Event) -> None:
        """The engine cancels its attempts: the CSP calls still running are stopped too."""
        await cancel.wait()
        if self._targets is not None:
            self._targets.stop_workers.set()

    # -- database round trips ----------------------------------------------------------------------------
    def _pool(self) -> Any:
        assert self._context is not None, "Documents.bind was not called (an Engine binds it at start)"
        return self._context.pool

    def _at(self) -> dt.datetime | None:
        return self.clock() if self.clock is not None else None

    async def _candidates(self) -> tuple[list[Candidate], dict[str, int], dict[int, int], float | None]:
        """The candidates, each one's principal (oid), the attempts of those principals running elsewhere,
        and the seconds until the next task is due (None: nothing planned): one round trip."""
        assert self._context is not None
        params = (self._at(), self.node_id, list(self._in_flight))
        async with self._pool().connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            async with conn.pipeline():
                await cur.execute(CANDIDATES, (*params, self.node_id, self._context.principals.backend_pids()))
                after = await conn.execute(NEXT_DUE, params)
            rows = await cur.fetchall()
            due_row = await after.fetchone()
        self.hints_skipped = bool(due_row and due_row[1] is not None and due_row[1] >= NOTIFY_QUEUE_LIMIT)
        due = None if due_row is None or due_row[0] is None else float(due_row[0])
        candidates = [Candidate(r["num"], r["version"], r["due_at"], r["sys_process_id"],
                                None if r["process_status"] is None else
                                model.ProcessState(r["process_status"], bool(r["process_live"]), r["process_error"]),
                                r["now_ts"]) for r in rows]
        elsewhere = {int(r["principal_oid"] or 0): int(r["elsewhere"]) for r in rows}
        return candidates, {r["num"]: int(r["principal_oid"] or 0) for r in rows}, elsewhere, due

    def _plan_next_look(self, due: float | None, left: bool) -> None:
        """When to look again: when the next task is due, at the latest after the check period (or
        HINTLESS_CHECK_S while changes send no wake-up) and the reload period; soon when one due now was
        left; at once on a notification or when an item ends (``poke``, ``_guard``)."""
        now = time.monotonic()
        waits = [self.check_period_s, self.reload_period_s - (now - self._last_reload)]
        if self.hints_skipped:
            waits.append(HINTLESS_CHECK_S)
        if due is not None:
            waits.append(max(due, UNTAKEN_RECHECK_S) if due <= 0 or left else due)
        self._look_at = now + max(0.0, min(waits))

    async def _start(self, c: Candidate) -> Started | None:
        async with self._pool().connection() as conn:
            cur = await conn.execute("SELECT * FROM radix.doc_start(%s, %s, %s, %s)",
                                     (c.num, c.sys_process_id, self.node_id, self._at()))
            row = await cur.fetchone()
        return None if row is None else Started(*row)

    async def _record(self, process_id: int, error: str | None) -> dt.datetime | None:
        async with self._pool().connection() as conn:
            cur = await conn.execute("SELECT radix.doc_record(%s, %s, %s, %s)",
                                     (process_id, error is None, error, self._at()))
            row = await cur.fetchone()
        return row[0] if row else None

    def _error(self, num: str, process_id: int | None, error: str) -> None:
        self.last_error = {"num": num, "process_id": process_id, "error": error, "node": self.node_id}
