"""The principal's own schema-qualified functions in INTERVAL / INTERVAL_ERROR (issue #12).

The expression language was widened: ``myschema.f(now())`` is accepted (resolved in that schema only, as the
search_path of the evaluation is pinned to pg_catalog). It is the principal's own code, as DB_FUNCTION runs,
so it gets no more than the principal has: it runs logged in as RUN_AS, in a READ ONLY transaction that is
rolled back, under the statement timeout. A function that writes, spins with its own
``SET statement_timeout = 0``, notifies, or lives in a schema the principal may not use, gets nothing.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql

from tests.integration.test_documents import Clock, Tenant, clock, doc, scheduler, tenant
from tests.support import document_runs

__all__ = ["clock", "tenant"]  # fixtures

OWN_SQL = """
CREATE FUNCTION work.writes(t timestamptz) RETURNS timestamptz LANGUAGE plpgsql AS
$$ BEGIN INSERT INTO work.archive (who) VALUES ('written'); RETURN t + interval '1 hour'; END $$;
CREATE FUNCTION work.spins(t timestamptz) RETURNS timestamptz LANGUAGE plpgsql
SET statement_timeout = 0 AS $$ BEGIN PERFORM pg_catalog.pg_sleep(600); RETURN t; END $$;
CREATE FUNCTION work.notifies(t timestamptz) RETURNS timestamptz LANGUAGE plpgsql AS
$$ BEGIN PERFORM pg_catalog.pg_notify('radix_documents', 'flood'); RETURN t + interval '1 hour'; END $$;
"""


@pytest.fixture
def work(tenant: Tenant) -> Tenant:
    tenant.admin.execute(OWN_SQL)
    tenant.admin.execute(sql.SQL("GRANT ALL ON ALL FUNCTIONS IN SCHEMA work TO {}").format(
        sql.Identifier(tenant.role)))
    return tenant


@pytest.mark.parametrize(("interval", "reason"), [
    ("work.writes(now())", "[25006]"),  # read only: the write is refused, nothing is written
    ("work.spins(now())", "[57014]"),  # its own SET statement_timeout = 0 does not lift the bound
])
async def test_own_functions_stay_read_only_and_bounded(work: Tenant, db: str, clock: Clock, interval: str,
                                                        reason: str) -> None:
    work.apply(doc(1, INTERVAL=interval))
    started = time.monotonic()
    async with scheduler(db, clock, expression_timeout_ms=300) as s:
        assert await document_runs(s) == 1
    assert time.monotonic() - started < 120  # cancelled after 300 ms, long before the 600 s sleep ends
    found = work.doc(1)
    assert found["status"] == "CRON_TABLE_PASSIVE"
    assert f"INTERVAL: evaluation failed: {reason}" in found["props"]["ERROR_TEXT"]
    assert work.archive() == [work.role]


async def test_a_qualified_function_runs_as_the_principal_only(work: Tenant, db: str, clock: Clock) -> None:
    """A function of a schema the principal may not use is refused by PostgreSQL, as the principal."""
    work.admin.execute("CREATE SCHEMA vault; CREATE FUNCTION vault.f(t timestamptz) RETURNS timestamptz "
                       "LANGUAGE sql AS $$ SELECT t + interval '1 hour' $$")
    work.apply(doc(1, INTERVAL="vault.f(now())"))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
    found = work.doc(1)
    assert found["status"] == "CRON_TABLE_PASSIVE"
    assert "INTERVAL: evaluation failed: [42501]" in found["props"]["ERROR_TEXT"]
    assert "vault" not in found["props"]["ERROR_TEXT"]  # redacted: the object is not named




async def test_a_notification_from_an_own_function_is_rolled_back(work: Tenant, db: str, clock: Clock) -> None:
    with psycopg.connect(db, autocommit=True) as listener:
        listener.execute("LISTEN radix_documents")
        work.apply(doc(1, INTERVAL="work.notifies(now())"))
        list(listener.notifies(timeout=1))  # the apply's own hint
        async with scheduler(db, clock) as s:
            assert await document_runs(s) == 1
        found = work.doc(1)
        assert found["status"] == "CRON_TABLE_ACTIVE", found
        assert "flood" not in [n.payload for n in listener.notifies(timeout=1)]
