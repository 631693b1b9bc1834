"""Finishing a CRON_TABLE task after its run (the seed's ``_finishTask``): count its errors, evaluate its
next time as its principal, write both.

Invariants:
- the decision is pure (``model.plan_finish``, ``model.settle``); only the next time's evaluation and the
  two round trips touch the database;
- the next time is evaluated on a connection logged in as RUN_AS (``expression.evaluate``, bounded by
  ``expression_timeout_ms``), never as the scheduler; a RUN_AS that cannot log in now (``model.may_pass``)
  makes the task try again after ``refusal_retry_s`` (the failure counts towards MAX_COUNT_ERROR), and
  connection trouble raises, so a later check finishes the task;
- ``radix.doc_finish`` writes the status, the next time and the error count in one transaction, fenced by
  the process and the document's version: a concurrent edit (``stale``) makes it decide again, at most
  ``FINISH_ROUNDS`` times; a lost process writes nothing.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any, Final

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from radixjobs import retry
from radixjobs.documents import expression, model
from radixjobs.engine.principals import PrincipalPools

# A task whose next time cannot be evaluated because RUN_AS cannot log in now (NOLOGIN) is tried again
# after this long; the failed run counts towards MAX_COUNT_ERROR.
REFUSAL_RETRY_S: Final = 60.0
FINISH_ROUNDS: Final = 5


class Finisher:
    """Finishes the tasks of one scheduler; counts the tasks it makes passive or errored in ``counters``
    (``doc_passive``, ``doc_errors``: the scheduler's own)."""

    def __init__(self, pool: AsyncConnectionPool[Any], principals: PrincipalPools, counters: Counter[str], *,
                 refusal_retry_s: float, expression_timeout_ms: int):
        self._pool = pool
        self._principals = principals
        self._counters = counters
        self.refusal_retry_s = refusal_retry_s
        self.expression_timeout_ms = expression_timeout_ms

    async def finish(self, num: str, process_id: int, error: str | None, end_at: dt.datetime | None,
                     now: dt.datetime) -> bool:
        """Write the finish; retried when the document changed meanwhile. False when nothing was written."""
        for _ in range(FINISH_ROUNDS):
            async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                await cur.execute("SELECT * FROM radix.doc_finish_state(%s, %s)", (num, process_id))
                state = await cur.fetchone()
            if state is None:
                return False
            plan = model.plan_finish(state["props"], state["count_error"], error)
            next_time, reason = await self.next_time(plan, state, now)
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
                    self._counters["doc_passive"] += 1
                elif settled.status is model.Status.ERROR:
                    self._counters["doc_errors"] += 1
            return verdict == "done"
        return False

    async def next_time(self, plan: model.FinishPlan, state: dict[str, Any],
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
