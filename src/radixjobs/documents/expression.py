"""Schedule expressions (INTERVAL, INTERVAL_ERROR): checked with PostgreSQL's own parser, evaluated safely.

An expression is user text that PostgreSQL evaluates, so it is never pasted into SQL as given
(research: postgres-facts §8 — a closing parenthesis alone can inject clauses). ``check`` parses
``SELECT <expression>`` with pglast, walks the tree against the allow-list (expression_check.py: what an
expression may be built from, sub-queries over the principal's tables included), rebuilds it as
``SELECT CAST(<expression> AS timestamptz)`` and prints it (deparse.py): comments and anything unparsed are
gone, and what runs is parsed again to be one statement.

The current time functions (``now()``, ``CURRENT_TIMESTAMP``, ``CURRENT_DATE``, ``LOCALTIMESTAMP``,
``clock_timestamp()``…) are replaced by the bound parameter ``$1``: "now" is the scheduler's clock at the
end of the run, passed in, so the next time does not depend on when the evaluating transaction began,
and tests can drive time. ``evaluate`` runs the checked statement with that parameter (extended
protocol: one statement only) in a READ ONLY transaction that is rolled back, with a short
statement_timeout (it bounds the whole statement: sub-queries, lock waits, the principal's own functions),
search_path = pg_catalog and TimeZone = UTC, on a connection logged in as the document's principal, so a
table or function the principal may not use fails as PostgreSQL refuses it; the pool's reset (everything
DISCARD ALL does but DISCARD PLANS) cleans the session after.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from pglast import parse_sql
from pglast.parser import ParseError

from radixjobs import retry
from radixjobs.db import first_line
from radixjobs.documents.deparse import deparse
from radixjobs.documents.expression_check import (
    AGGREGATES,
    ALLOWED_FUNCTIONS,
    ALLOWED_OPERATORS,
    ALLOWED_TYPES,
    MAX_DEPTH,
    MAX_LENGTH,
    NOW_FUNCTIONS,
    ONE_LINE,
    ExpressionRefused,
    rewrite,
)

__all__ = ["AGGREGATES", "ALLOWED_FUNCTIONS", "ALLOWED_OPERATORS", "ALLOWED_TYPES", "MAX_DEPTH", "MAX_LENGTH",
           "NOW_FUNCTIONS", "CheckedExpression", "EvaluationFailed", "ExpressionRefused", "check", "db_error_text",
           "evaluate"]

# Sent on the principal's connection, under the principal's search_path: every name is qualified.
_SETTINGS: Final = ("SELECT pg_catalog.set_config('statement_timeout', %s::pg_catalog.text, true), "
                    "pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true), "
                    "pg_catalog.set_config('TimeZone', 'UTC', true), "
                    "pg_catalog.set_config('DateStyle', 'ISO, MDY', true), "
                    "pg_catalog.set_config('IntervalStyle', 'postgres', true)")


class EvaluationFailed(Exception):
    """PostgreSQL could not evaluate a checked expression; ``str()`` says why, in one line."""

    def __init__(self, reason: str):
        super().__init__(reason.translate(ONE_LINE))


@dataclass(frozen=True)
class CheckedExpression:
    """An accepted expression: ``sql`` is the deparsed statement, with ``$1`` for "now"."""

    text: str
    sql: str


def check(text: str) -> CheckedExpression:
    """Accept or refuse ``text``; raises ExpressionRefused naming the first thing not allowed."""
    if not text.strip():
        raise ExpressionRefused("the expression is empty")
    if len(text) > MAX_LENGTH:
        raise ExpressionRefused(f"the expression is longer than {MAX_LENGTH} characters")
    try:
        statements = parse_sql(f"SELECT {text}")
    except ParseError as exc:
        raise ExpressionRefused(_syntax_error(exc)) from None
    if len(statements) != 1:
        raise ExpressionRefused("only one expression is allowed (no statement separators)")
    stmt: Any = statements[0].stmt
    rewrite(stmt)
    try:
        deparsed = deparse(stmt)
    except RecursionError:  # defence in depth: MAX_DEPTH keeps the printer far from the limit
        raise ExpressionRefused(f"the expression is nested too deeply (more than {MAX_DEPTH} levels)") from None
    if len(parse_sql(deparsed)) != 1:  # defence in depth: what runs is one statement
        raise ExpressionRefused("the expression does not deparse to one statement")
    return CheckedExpression(text, deparsed)


def _syntax_error(exc: ParseError) -> str:
    message = str(exc.args[0]) if exc.args else "syntax error"
    if len(exc.args) > 1 and isinstance(exc.args[1], int):
        # the location counts the "SELECT " put in front of the expression
        return f"{message} at character {max(1, exc.args[1] - len('SELECT ') + 1)}"
    return message


async def evaluate(conn: psycopg.AsyncConnection[Any], checked: CheckedExpression, now: dt.datetime, *,
                   timeout_ms: int = 1000) -> dt.datetime | None:
    """The expression's value with ``now`` for the current time; None for NULL.

    Raises EvaluationFailed (a one-line reason) when PostgreSQL refuses it, it times out, or the value is
    not a finite time. ``conn`` is an autocommit connection logged in as the document's principal.
    """
    try:
        async with conn.transaction(force_rollback=True):
            await conn.execute("SET TRANSACTION READ ONLY")
            await conn.execute(_SETTINGS, (str(timeout_ms),))
            cur = psycopg.AsyncRawCursor(conn)
            await cur.execute(checked.sql, [now], prepare=True)
            row = await cur.fetchone()
    except psycopg.DataError as exc:
        if exc.sqlstate is None:  # a value Python cannot hold (infinity, year > 9999)
            raise EvaluationFailed("the value is not a finite time") from None
        raise EvaluationFailed(db_error_text(exc)) from None
    except psycopg.Error as exc:
        if _connection_trouble(exc):
            raise  # not the expression's fault: the caller finishes the task later
        raise EvaluationFailed(db_error_text(exc)) from None
    value = row[0] if row else None
    if value is not None and not isinstance(value, dt.datetime):
        raise EvaluationFailed(f"the value is not a time: {value!r}")
    return value


def _connection_trouble(exc: psycopg.Error) -> bool:
    state = exc.sqlstate or ""
    return isinstance(exc, psycopg.OperationalError) and (not state or (state[:2] in ("08", "57") and state != "57014"))


def db_error_text(exc: psycopg.Error, prefix: str = "") -> str:
    """``[SQLSTATE] message`` in one line; security failures never name the object or role (redacted)."""
    message = exc.diag.message_primary or first_line(exc)
    state = f"[{exc.sqlstate}] " if exc.sqlstate else ""
    return f"{state}{prefix}{retry.redact(retry.classify(exc.sqlstate, message), message)}"
