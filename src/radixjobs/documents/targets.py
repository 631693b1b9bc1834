"""Running one CRON_TABLE task's target, as its principal: a DB_FUNCTION on a connection logged in as
RUN_AS, a CSP_SERVICE in a worker process (documents/services.py).

Invariants:
- a run's outcome is one line of text (None: success), never an exception: a refusal recorded by
  radix.doc_start, a login that failed, a routine that raised or timed out all become that line;
- a DB_FUNCTION is called without arguments, in a DO block (nothing it returns reaches the scheduler), its
  name quoted by psycopg.sql and resolved as PostgreSQL would (ZERO_ARGUMENT_ROUTINE, every name qualified);
- a call never outlives its bound, as an attempt of a job does not: its session's statement_timeout is
  ``db_timeout_s`` (which holds even when this node is gone), and the engine's watchdog cancels it then
  and ends its backend after the grace, or when the engine is cancelled (engine/work.py ``watch``);
- two runs of one task never overlap: a rerun (the node of the previous run died) first waits until no
  backend of the principal still runs a call tagged for the task (RUN_TAG), and fails when one still does
  after ``db_timeout_s``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from radixjobs.documents import expression, model
from radixjobs.documents.model import Started
from radixjobs.documents.services import ServiceRegistry
from radixjobs.documents.services import call as call_service
from radixjobs.engine.definitions import dollar_quoted
from radixjobs.engine.principals import PrincipalPools
from radixjobs.engine.work import Watch

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
# The call's bound, set for the session before it (the clean resets it): a DO block sent with it in one
# query would run in an implicit transaction block, where a procedure may not commit.
STATEMENT_TIMEOUT: Final = "SELECT pg_catalog.set_config('statement_timeout', %s::pg_catalog.text, false)"
QUERY_CANCELED: Final = "57014"


class TargetRunner:
    """Runs the targets of one engine's tasks: ``pool`` is the engine's own (the rerun's check),
    ``principals`` the connections logged in as each RUN_AS, ``watch`` the engine's watchdog."""

    def __init__(self, pool: AsyncConnectionPool[Any], principals: PrincipalPools, watch: Watch, *,
                 db_timeout_s: float, service_timeout_s: float):
        self._pool = pool
        self._principals = principals
        self._watch = watch
        self.db_timeout_s = db_timeout_s
        self.service_timeout_s = service_timeout_s
        self.stop_workers = threading.Event()  # set: the CSP worker calls still running are stopped

    async def run(self, started: Started, num: str, registry: ServiceRegistry, *, rerun: bool) -> str | None:
        """Run the target; the one-line error, or None on success."""
        if started.refusal:
            return started.refusal
        if started.kind == "csp":
            outcome = await call_service(registry, started.target, started.params,
                                          timeout_s=self.service_timeout_s, cancel=self.stop_workers)
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
        """PERFORM f() or CALL p() in a DO block, by what the name is; bounded by db_timeout_s (then
        cancelled, and the backend ended after the engine's grace)."""
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
        began = time.monotonic()
        try:
            await conn.execute(STATEMENT_TIMEOUT, (str(max(1, int(self.db_timeout_s * 1000))),))
            async with self._watch(conn, self.db_timeout_s):
                await conn.execute(verb)
        except psycopg.Error as exc:
            if time.monotonic() - began >= self.db_timeout_s:
                how = "its statement was cancelled" if exc.sqlstate == QUERY_CANCELED else "its session was ended"
                return f"DB_FUNCTION timed out after {self.db_timeout_s:g} s: {how}"
            return expression.db_error_text(exc)
        return None
