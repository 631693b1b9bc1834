"""Sub-queries and random() in INTERVAL / INTERVAL_ERROR, attacked through the real path: a document applied,
then run and finished by the document scheduler, its expression evaluated as RUN_AS.

A sub-query reads the principal's own tables with the principal's own privileges, in the evaluation's
READ ONLY, rolled-back transaction under the statement timeout. It is no way around the function allow-list,
and it never locks, writes, reads a table the principal may not read, or outlasts the timeout.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql

from radixjobs.documents import DocumentError
from radixjobs.documents.expression import CheckedExpression, EvaluationFailed, evaluate
from radixjobs.engine.principals import PrincipalPools
from tests.integration.test_documents import T0, Clock, Tenant, clock, doc, scheduler, tenant
from tests.support import document_runs

__all__ = ["clock", "tenant"]  # fixtures

APP_SQL = """
CREATE SCHEMA app;
CREATE TABLE app.slots (at timestamptz NOT NULL);
INSERT INTO app.slots VALUES ('2025-01-01 06:00+00'), ('2025-01-02 06:00+00');
CREATE TABLE app.vault (secret text);
INSERT INTO app.vault VALUES ('hunter2');
CREATE TABLE app.big (n int);
INSERT INTO app.big SELECT generate_series(1, 3000);
CREATE SEQUENCE app.seq;
"""


@pytest.fixture
def app(tenant: Tenant) -> Tenant:
    """The tenant may read app.slots and app.big and use app.seq; app.vault is not its to read."""
    tenant.admin.execute(APP_SQL)
    tenant.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {r}; GRANT SELECT ON app.slots, app.big TO {r}; "
                                 "GRANT ALL ON SEQUENCE app.seq TO {r}").format(r=sql.Identifier(tenant.role)))
    return tenant


def _untouched(app: Tenant) -> None:
    assert app.admin.execute("SELECT count(*) FROM app.slots").fetchone() == (2,)
    assert app.admin.execute("SELECT is_called FROM app.seq").fetchone() == (False,)
    app.admin.execute("SELECT 1 FROM app.slots FOR UPDATE NOWAIT")  # no row lock survived the evaluation


async def test_a_table_the_principal_may_not_read_fails_redacted(app: Tenant, db: str, clock: Clock) -> None:
    app.apply(doc(1, INTERVAL="(SELECT max(secret) FROM app.vault)::timestamptz"))  # privileges are PostgreSQL's
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
    found = app.doc(1)
    assert found["status"] == "CRON_TABLE_PASSIVE"
    error = found["props"]["ERROR_TEXT"]
    assert "INTERVAL: evaluation failed: [42501] permission denied (redacted)" in error
    assert "vault" not in error
    assert "hunter2" not in error
    assert "\n" not in error


SMUGGLED = [
    # the function allow-list holds inside a sub-query
    "(SELECT max(at) FROM app.slots WHERE pg_sleep(600) IS NULL)",
    "(SELECT max(at) FROM app.slots WHERE set_config('statement_timeout', '0', false) = '0')",
    "now() + (SELECT nextval('app.seq') FROM app.slots LIMIT 1) * interval '1 second'",
    "(SELECT max(at) FROM app.slots, pg_sleep(600))",
    "now() + setseed(0.5)::text::interval",
    # no locking clause, no write, no system catalog
    "(SELECT max(at) FROM app.slots FOR UPDATE)",
    "(SELECT max(at) FROM app.slots FOR NO KEY UPDATE SKIP LOCKED)",
    "(WITH gone AS (DELETE FROM app.slots RETURNING at) SELECT max(at) FROM gone)",
    "(SELECT max(rolpassword)::timestamptz FROM pg_catalog.pg_authid)",
    "(SELECT max(at) FROM pg_temp.slots)",
]


async def test_a_sub_query_is_no_way_around_the_rules(app: Tenant, db: str, clock: Clock) -> None:
    for n, payload in enumerate(SMUGGLED, 1):
        with pytest.raises(DocumentError, match="INTERVAL is refused"):
            app.apply(doc(n, INTERVAL=payload))  # the CLI and the Python API refuse it whole
        app.apply_sql(doc(n, INTERVAL=payload))  # written with SQL: refused when it is first needed
    started = time.monotonic()
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == len(SMUGGLED)
    assert time.monotonic() - started < 120  # pg_sleep(600) never ran
    for n in range(1, len(SMUGGLED) + 1):
        found = app.doc(n)
        assert found["status"] == "CRON_TABLE_PASSIVE", found
        assert "INTERVAL: refused: " in found["props"]["ERROR_TEXT"], found
    _untouched(app)


async def test_what_the_checker_refuses_fails_in_postgresql_too(app: Tenant, db: str) -> None:
    """Defence in depth: locking and writing sub-queries sent straight to the evaluation, past the checker."""
    unchecked = {
        "SELECT CAST((SELECT at FROM app.slots LIMIT 1 FOR UPDATE) AS timestamptz)": "[25006]",
        "SELECT CAST((SELECT at FROM app.slots LIMIT 1 FOR SHARE) AS timestamptz)": "[25006]",
        "SELECT CAST($1 AS timestamptz) + (SELECT nextval('app.seq') FROM app.slots LIMIT 1) * interval '1 s'":
            "[25006]",
        "WITH gone AS (DELETE FROM app.slots RETURNING at) SELECT CAST(max(at) AS timestamptz) FROM gone": "[25006]",
        "SELECT CAST((WITH gone AS (DELETE FROM app.slots RETURNING at) SELECT max(at) FROM gone) AS timestamptz)":
            "[0A000]",
    }
    pools = PrincipalPools(db, max_idle=1)
    try:
        for text, state in unchecked.items():
            async with pools.connection(app.role) as c:
                with pytest.raises(EvaluationFailed) as failed:
                    await evaluate(c, CheckedExpression(text, text), T0, timeout_ms=300)
                assert str(failed.value).startswith(state), failed.value
    finally:
        await pools.close()
    _untouched(app)


async def test_a_sub_query_that_runs_forever_is_cancelled_by_the_timeout(app: Tenant, db: str,
                                                                         clock: Clock) -> None:
    app.apply(doc(1, INTERVAL="now() + (SELECT count(*) FROM app.big a, app.big b, app.big c) * interval '1 s'"))
    started = time.monotonic()
    async with scheduler(db, clock, expression_timeout_ms=300) as s:
        assert await document_runs(s) == 1
    assert time.monotonic() - started < 120  # cancelled after 300 ms: the cross join would run for hours
    found = app.doc(1)
    assert found["status"] == "CRON_TABLE_PASSIVE"
    assert "INTERVAL: evaluation failed: [57014]" in found["props"]["ERROR_TEXT"]


async def test_a_sub_query_waiting_for_a_lock_is_cancelled_by_the_timeout(app: Tenant, db: str,
                                                                          clock: Clock) -> None:
    app.apply(doc(1, INTERVAL="(SELECT min(at) FROM app.slots WHERE at > now())"))
    with psycopg.connect(db) as holder:  # another session holds the table: the read would wait forever
        holder.execute("LOCK TABLE app.slots IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        async with scheduler(db, clock, expression_timeout_ms=300) as s:
            assert await document_runs(s) == 1
        assert time.monotonic() - started < 120  # cancelled after 300 ms: the lock is held until the rollback
        holder.rollback()
    found = app.doc(1)
    assert found["status"] == "CRON_TABLE_PASSIVE"
    assert "INTERVAL: evaluation failed: [57014]" in found["props"]["ERROR_TEXT"]
    _untouched(app)

