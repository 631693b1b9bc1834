"""Documents and expressions against a real PostgreSQL, with modest numbers of examples.

- Python and the database name the same problems for any document (radix.document_problems is what a SQL
  user gets; model.document_problems what the CLI and the API check first).
- documents.apply of random and mutated lists, as a non-superuser writer: accepted as a whole, or refused
  with the project's own error and nothing written at all.
- Accepted schedule expressions evaluate as the principal to a time, NULL, or a one-line EvaluationFailed,
  and leave neither data nor session state behind.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import psycopg
import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from radixjobs import documents
from radixjobs.documents.expression import EvaluationFailed, ExpressionRefused, check, evaluate
from radixjobs.documents.model import document_num, document_problems
from radixjobs.errors import RadixError
from tests.fuzz import database_settings
from tests.fuzz.test_documents import json_values, mutated_documents
from tests.fuzz.test_expression import mutated
from tests.support import PgCluster

SNAPSHOT = "SELECT num, version, status, props, principal_oid, next_run FROM radix.cron_table ORDER BY num"
SESSION = ("SELECT current_setting('statement_timeout'), current_setting('search_path'), "
           "current_setting('TimeZone'), current_setting('transaction_read_only')")


class Writer:
    """A LOGIN role that writes documents; ``others`` are roles it may or may not name as RUN_AS."""

    def __init__(self, db: str, pg: PgCluster, conn: psycopg.Connection[Any], roles: Any):
        self.admin = conn
        self.role = roles("writer")
        member, stranger, nologin = roles("member"), roles("stranger"), roles("nologin", "NOLOGIN")
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(member), sql.Identifier(self.role)))
        conn.execute("CREATE FUNCTION public.archive_logs() RETURNS void LANGUAGE sql AS $$ SELECT 1 $$")
        self.others = [self.role, member, stranger, nologin, "postgres", "no_such_role", ""]
        dbname = psycopg.conninfo.conninfo_to_dict(db)["dbname"]
        self.dsn = pg.dsn_for(str(dbname), user=self.role)
        self.conn = psycopg.connect(self.dsn, autocommit=True)

    def snapshot(self) -> list[tuple[Any, ...]]:
        return self.admin.execute(SNAPSHOT).fetchall()


@pytest.fixture
def writer(db: str, pg: PgCluster, conn: psycopg.Connection[Any], roles: Any) -> Any:
    w = Writer(db, pg, conn, roles)
    yield w
    w.conn.close()


def _storable(value: Any) -> bool:
    return "\\u0000" not in json.dumps(value)  # jsonb cannot hold NUL characters


@database_settings()
@given(st.one_of(mutated_documents(), json_values))
def test_python_and_the_database_name_the_same_problems(conn: psycopg.Connection[Any], doc: Any) -> None:
    assume(_storable(doc))
    row = conn.execute("SELECT radix.document_problems(%s), radix.document_num(%s)", (Jsonb(doc), Jsonb(doc)))
    problems, num = row.fetchone() or (None, None)
    assert problems == document_problems(doc), doc
    assert num == document_num(doc), doc


@st.composite
def plausible_documents(draw: st.DrawFn) -> dict[str, Any]:
    """Valid in shape, so that they reach the database's own checks (RUN_AS, ownership, updates)."""
    props: dict[str, Any] = {"NUM": draw(st.sampled_from([1, 2, "2", "three", 4])),
                             "DB_FUNCTION": draw(st.sampled_from(["archive_logs", "public.archive_logs", "x.y"])),
                             "INTERVAL": draw(st.sampled_from(["", "now() + interval '1 hour'", "CURRENT_DATE + 1"]))}
    if draw(st.booleans()):
        props["FIRST_RUN"] = draw(st.sampled_from(["2025-01-01T00:00:00", "2030-06-01 12:00:00+02:00"]))
    if draw(st.booleans()):
        props["MAX_COUNT_ERROR"] = draw(st.integers(0, 5))
    status = draw(st.sampled_from(["CRON_TABLE_ACTIVE", "CRON_TABLE_PASSIVE", "CRON_TABLE_ERROR",
                                       "CRON_TABLE_DISABLED"]))
    return {"dockind": "CRON_TABLE", "status": status, "props": props}


@st.composite
def writes(draw: st.DrawFn, others: list[str]) -> Any:
    docs = draw(st.lists(st.one_of(mutated_documents(), plausible_documents()), min_size=1, max_size=3))
    for doc in docs:
        props = doc.get("props") if isinstance(doc, dict) else None
        if isinstance(props, dict) and draw(st.booleans()):
            props["RUN_AS"] = draw(st.sampled_from(others))
        if isinstance(props, dict) and isinstance(props.get("DB_FUNCTION"), str) and draw(st.booleans()):
            props["DB_FUNCTION"] = draw(st.sampled_from(["archive_logs", "public.archive_logs", "missing_fn"]))
    return docs[0] if len(docs) == 1 and draw(st.booleans()) else docs


@database_settings()
@given(data=st.data())
def test_apply_is_all_or_nothing(writer: Writer, data: st.DataObject) -> None:
    docs = data.draw(writes(writer.others))
    before = writer.snapshot()
    refused: RadixError | None = None
    try:
        results = documents.apply(writer.conn, docs)
    except RadixError as exc:  # the project's own errors only: anything else fails the test
        refused = exc
    if refused is not None:
        event(f"refused: {type(refused).__name__} {refused.code}")
        assert str(refused).strip(), docs
        assert writer.snapshot() == before, docs  # nothing written when refused
        return
    event("accepted")
    assert _storable(docs)
    items = docs if isinstance(docs, list) else [docs]
    assert [r["num"] for r in results] == [document_num(d) for d in items]
    stored = {row[0]: row[1] for row in writer.snapshot()}
    for result in results:
        assert stored[result["num"]] == result["version"]


async def _evaluate(dsn: str, checked: Any, now: dt.datetime) -> tuple[Any, bool]:
    """(the value or the EvaluationFailed, whether the session's settings are as before)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(SESSION)
        before = await cur.fetchone()
        try:
            value: Any = await evaluate(conn, checked, now, timeout_ms=500)
        except EvaluationFailed as exc:
            value = exc
        cur = await conn.execute(SESSION)
        return value, await cur.fetchone() == before


@database_settings()
@given(mutated(), st.datetimes(min_value=dt.datetime(1990, 1, 1), max_value=dt.datetime(2200, 1, 1),
                               timezones=st.just(dt.UTC)))
def test_accepted_expressions_evaluate_cleanly_as_the_principal(writer: Writer, text: str, now: dt.datetime) -> None:
    try:
        checked = check(text)
    except ExpressionRefused:
        assume(False)
        return
    before = writer.snapshot()
    value, session_unchanged = asyncio.run(_evaluate(writer.dsn, checked, now))
    if isinstance(value, EvaluationFailed):
        assert str(value)
        assert "\n" not in str(value), repr(str(value))
    else:
        assert value is None or isinstance(value, dt.datetime)
    assert session_unchanged  # statement_timeout, search_path, TimeZone, read-only: the transaction's only
    assert writer.snapshot() == before
