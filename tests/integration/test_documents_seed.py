"""What the DocScheduler seed allows, against a real PostgreSQL: a status other than ACTIVE disables a task
(CRON_TABLE_DISABLED is stored as PASSIVE), and INTERVAL expressions may draw random() and read the principal's
tables with sub-queries, evaluated as the principal, read-only, rolled back and under the timeout.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from radixjobs.documents import DocumentError
from radixjobs.documents.expression import MAX_DEPTH, MAX_LENGTH, check, evaluate
from radixjobs.documents.model import document_problems
from tests.integration.test_documents import HOUR, MINUTE, T0, Clock, Tenant, clock, doc, scheduler, tenant
from tests.support import document_runs

__all__ = ["clock", "tenant"]  # fixtures

FIRST = "2024-12-31T00:00:00"


def _run_state(props: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(props[k] for k in ("COUNT_ERROR", "NEXT_RUN", "LAST_RUN", "ERROR_TEXT", "DAILY_END_TIME"))


async def test_a_disabled_task_keeps_its_state_does_not_run_and_resumes_when_active(tenant: Tenant, db: str,
                                                                                    clock: Clock) -> None:
    tenant.admin.execute("UPDATE work.switch SET failing = true")
    tenant.apply(doc(1, FIRST_RUN=FIRST, MAX_COUNT_ERROR=5))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1  # fails: COUNT_ERROR 1, due again in an hour
        failed = tenant.props(1)
        assert failed["COUNT_ERROR"] == 1
        disabled = doc(1, FIRST_RUN=FIRST, MAX_COUNT_ERROR=5, status="CRON_TABLE_DISABLED")
        assert tenant.apply(disabled) == [{"num": "1", "action": "updated", "version": 2, "ignored": []}]
        assert tenant.apply(disabled)[0]["action"] == "unchanged"  # stored as PASSIVE: nothing new
        assert tenant.apply_sql(disabled)["action"] == "unchanged"
        found = tenant.doc(1)
        assert found["status"] == "CRON_TABLE_PASSIVE"
        assert _run_state(found["props"]) == _run_state(failed)  # the run state is kept while disabled
        clock.now += 48 * HOUR
        assert await document_runs(s) == 0
        assert await s.work.next_due_in() is None
        assert s.counters["doc_runs"] == 1

        tenant.admin.execute("UPDATE work.switch SET failing = false")
        assert tenant.apply(doc(1, FIRST_RUN=FIRST, MAX_COUNT_ERROR=5))[0]["version"] == 3
        rearmed = tenant.props(1)
        assert (rearmed["COUNT_ERROR"], rearmed["NEXT_RUN"], rearmed["ERROR_TEXT"]) == (0, None, None)
        assert await document_runs(s) == 1  # ACTIVE again: it resumes at once (FIRST_RUN has passed)
    found = tenant.doc(1)
    assert (found["status"], found["props"]["COUNT_ERROR"]) == ("CRON_TABLE_ACTIVE", 0)
    assert tenant.archive() == [tenant.role]


async def test_a_task_created_disabled_never_runs_whatever_writes_it(tenant: Tenant, db: str, clock: Clock) -> None:
    created = tenant.apply(doc(1, status="CRON_TABLE_DISABLED"))
    assert created == [{"num": "1", "action": "created", "version": 1, "ignored": []}]
    assert tenant.apply_sql(doc(2, status="CRON_TABLE_ON_HOLD"))["action"] == "created"  # SQL users alike
    assert tenant.apply_sql(doc(3, status="CRON_TABLE_ERROR"))["action"] == "created"
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 0
    assert [tenant.doc(n)["status"] for n in (1, 2, 3)] == [
        "CRON_TABLE_PASSIVE", "CRON_TABLE_PASSIVE", "CRON_TABLE_ERROR"]
    assert tenant.archive() == []


@pytest.mark.parametrize("status", ["cron_table_disabled", "DISABLED", "CRON_TABLE_", "CRON_TABLE_dis",
                                    " CRON_TABLE_DISABLED", "CRON_TABLE_DISABLED\n", "CRON_TABLE_ÄUS"])
def test_a_status_not_of_the_form_cron_table_name_is_refused_alike(tenant: Tenant, status: str) -> None:
    """ACTIVE in lower case, a bare word, a stray space: refused, never read as "disabled"."""
    bad = doc(1, status=status)
    [problem] = document_problems(bad)
    assert problem.startswith("status must be CRON_TABLE_ACTIVE, CRON_TABLE_PASSIVE or CRON_TABLE_ERROR, not ")
    row = tenant.admin.execute("SELECT radix.document_problems(%s)", (Jsonb(bad),)).fetchone()
    assert row == ([problem],)
    assert tenant.admin.execute("SELECT radix.document_problems(%s)",
                                (Jsonb(doc(1, status="CRON_TABLE_DISABLED")),)).fetchone() == ([],)
    with pytest.raises(DocumentError, match="status must be"):
        tenant.apply(bad)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        tenant.apply_sql(bad)
    assert tenant.admin.execute("SELECT count(*) FROM radix.cron_table").fetchone() == (0,)


# -- random() and sub-queries over the principal's tables --------------------------------------------------------

SLOTS_SQL = """
CREATE SCHEMA app;
CREATE TABLE app.slots (at timestamptz NOT NULL, kind text NOT NULL, owner name NOT NULL DEFAULT current_user);
CREATE TABLE app.holidays (day date PRIMARY KEY);
ALTER TABLE app.slots ENABLE ROW LEVEL SECURITY;
CREATE POLICY mine ON app.slots USING (owner = current_user);
"""


@pytest.fixture
def slots(tenant: Tenant) -> Tenant:
    tenant.admin.execute(SLOTS_SQL)
    tenant.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {r}; GRANT SELECT ON app.slots, app.holidays TO {r}")
                         .format(r=sql.Identifier(tenant.role)))
    tenant.admin.execute("INSERT INTO app.slots (at, kind, owner) VALUES "
                         "('2025-01-01 06:00+00', 'backup', %(me)s), ('2025-01-01 09:00+00', 'backup', %(me)s), "
                         "('2025-01-01 03:00+00', 'backup', 'someone_else'), "
                         "('2025-01-01 04:00+00', 'report', %(me)s)", {"me": tenant.role})
    tenant.admin.execute("INSERT INTO app.holidays VALUES ('2025-01-01')")
    return tenant


@pytest.mark.parametrize(("interval", "expected"), [
    # the principal's next backup slot: the row-level security policy hides another role's 03:00
    ("(SELECT min(s.at) FROM app.slots s WHERE s.at > now() AND s.kind = 'backup')", "2025-01-01T06:00:00+00:00"),
    ("coalesce((SELECT min(at) FROM app.slots WHERE at > now() AND kind = 'none'), now() + interval '1 day')",
     "2025-01-02T00:00:00+00:00"),
    ("CASE WHEN EXISTS (SELECT 1 FROM app.holidays h WHERE h.day = CURRENT_DATE) THEN now() + interval '1 day' "
     "ELSE now() + interval '1 hour' END", "2025-01-02T00:00:00+00:00"),  # T0 is a holiday
    ("now() + (SELECT count(*) FROM app.slots) * interval '1 hour'", "2025-01-01T03:00:00+00:00"),  # 3 visible
])
async def test_a_sub_query_reads_the_principals_tables_as_the_principal(slots: Tenant, db: str, clock: Clock,
                                                                        interval: str, expected: str) -> None:
    slots.apply(doc(1, INTERVAL=interval))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
    found = slots.doc(1)
    assert (found["status"], found["props"]["NEXT_RUN"]) == ("CRON_TABLE_ACTIVE", expected), found


async def test_random_spreads_the_next_run(tenant: Tenant, db: str, clock: Clock) -> None:
    tenant.apply([doc(n, INTERVAL="now() + interval '1 hour' + random() * interval '10 minutes'")
                  for n in range(1, 6)])
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 5
    times = {tenant.props(n)["NEXT_RUN"] for n in range(1, 6)}
    assert all(T0 + HOUR <= dt.datetime.fromisoformat(t) <= T0 + HOUR + 10 * MINUTE for t in times), times
    assert len(times) > 1  # drawn per run


# -- limits -------------------------------------------------------------------------------------------------

async def test_a_flat_sum_of_eighty_terms_runs(tenant: Tenant, db: str, clock: Clock) -> None:
    eighty = "now()" + " + interval '1 minute'" * 80
    tenant.apply(doc(1, INTERVAL=eighty))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
    found = tenant.doc(1)
    assert (found["status"], found["props"]["NEXT_RUN"]) == ("CRON_TABLE_ACTIVE", (T0 + 80 * MINUTE).isoformat())


async def test_postgresql_evaluates_what_the_limits_let_through(tenant: Tenant) -> None:
    """The longest run of one operator (MAX_LENGTH characters) and the deepest nesting (MAX_DEPTH)."""
    terms = (MAX_LENGTH - 40) // 4
    examples = {
        "now() + interval '1 second' * (1" + " + 1" * terms + ")": T0 + (terms + 1) * dt.timedelta(seconds=1),
        "now() + (interval '1 s'" + " + (interval '1 s'" * (MAX_DEPTH - 2) + ")" * (MAX_DEPTH - 2) + ")":
            T0 + (MAX_DEPTH - 1) * dt.timedelta(seconds=1),
        "coalesce(" * MAX_DEPTH + "now()" + ")" * MAX_DEPTH: T0,
    }
    async with await psycopg.AsyncConnection.connect(tenant.dsn, autocommit=True) as c:
        for text, expected in examples.items():
            assert len(text) <= MAX_LENGTH
            assert await evaluate(c, check(text), T0) == expected, text[:80]
