"""Run SQL scripts: plain statements go to PostgreSQL, job DDL to the job catalog."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from radixjobs import ddl
from radixjobs.catalog import execute_job_ddl
from radixjobs.errors import RadixError, StatementError
from radixjobs.model import ScriptStatement
from radixjobs.sqlscript import split_script


@dataclass
class StatementResult:
    """What one statement produced: a command tag and, for queries, columns and rows."""

    statement: ScriptStatement
    status: str
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def returns_rows(self) -> bool:
        return bool(self.columns)

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


# The job-DDL seam: given a connection and a job statement's text, perform it and return its tag.
JobStatementRunner = Callable[[psycopg.Connection[Any], str], str]


def run_script(conn: psycopg.Connection[Any], text: str,
               job_runner: JobStatementRunner = execute_job_ddl) -> Iterator[StatementResult]:
    """Run each statement in order (autocommit, as psql does); stop at the first failure.

    Raises StatementError naming the statement number and line.
    """
    for stmt in split_script(text):
        yield _run_one(conn, stmt, job_runner)


def has_job_statement(text: str) -> bool:
    """Whether the script holds job DDL (which needs the radix schema); raises ParseError as split_script."""
    return any(ddl.is_job_statement(stmt.text) for stmt in split_script(text))


def execute(conn: psycopg.Connection[Any], script: str) -> list[str]:
    """Run a script of SQL and job DDL (as ``radixjobs sql`` does); returns each statement's tag."""
    return [result.status for result in run_script(conn, script)]


def _run_one(conn: psycopg.Connection[Any], stmt: ScriptStatement,
             job_runner: JobStatementRunner) -> StatementResult:
    try:
        if ddl.is_job_statement(stmt.text):
            return StatementResult(stmt, job_runner(conn, stmt.text))
        cur = conn.execute(stmt.text.encode(), prepare=False)
        if cur.description is None:
            return StatementResult(stmt, cur.statusmessage or "")
        columns = [col.name for col in cur.description]
        return StatementResult(stmt, cur.statusmessage or "", columns, cur.fetchall())
    except psycopg.Error as exc:
        message = exc.diag.message_primary or str(exc).splitlines()[0]
        raise StatementError(stmt.number, stmt.line, message, exc.sqlstate) from None
    except RadixError as exc:
        raise StatementError(stmt.number, stmt.line, str(exc), getattr(exc, "code", None)) from None
