"""What the DocScheduler seed allows, against a real PostgreSQL: a status other than ACTIVE disables a task
(CRON_TABLE_DISABLED is stored as PASSIVE), and INTERVAL expressions may draw random() and read the principal's
tables with sub-queries, evaluated as the principal, read-only, rolled back and under the timeout.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from radixjobs.documents import DocumentError
from radixjobs.documents.model import document_problems
from tests.integration.test_documents import HOUR, Clock, Tenant, clock, doc, scheduler, tenant

__all__ = ["clock", "tenant"]  # fixtures

FIRST = "2024-12-31T00:00:00"


def _run_state(props: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(props[k] for k in ("COUNT_ERROR", "NEXT_RUN", "LAST_RUN", "ERROR_TEXT", "DAILY_END_TIME"))


async def test_a_disabled_task_keeps_its_state_does_not_run_and_resumes_when_active(tenant: Tenant, db: str,
                                                                                    clock: Clock) -> None:
    tenant.admin.execute("UPDATE work.switch SET failing = true")
    tenant.apply(doc(1, FIRST_RUN=FIRST, MAX_COUNT_ERROR=5))
    async with scheduler(db, clock) as s:
        assert await s.run_due() == 1  # fails: COUNT_ERROR 1, due again in an hour
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
        assert await s.run_due() == 0
        assert await s.next_due_in() is None
        assert s.counters["doc_runs"] == 1

        tenant.admin.execute("UPDATE work.switch SET failing = false")
        assert tenant.apply(doc(1, FIRST_RUN=FIRST, MAX_COUNT_ERROR=5))[0]["version"] == 3
        rearmed = tenant.props(1)
        assert (rearmed["COUNT_ERROR"], rearmed["NEXT_RUN"], rearmed["ERROR_TEXT"]) == (0, None, None)
        assert await s.run_due() == 1  # ACTIVE again: it resumes at once (FIRST_RUN has passed)
    found = tenant.doc(1)
    assert (found["status"], found["props"]["COUNT_ERROR"]) == ("CRON_TABLE_ACTIVE", 0)
    assert tenant.archive() == [tenant.role]


async def test_a_task_created_disabled_never_runs_whatever_writes_it(tenant: Tenant, db: str, clock: Clock) -> None:
    created = tenant.apply(doc(1, status="CRON_TABLE_DISABLED"))
    assert created == [{"num": "1", "action": "created", "version": 1, "ignored": []}]
    assert tenant.apply_sql(doc(2, status="CRON_TABLE_ON_HOLD"))["action"] == "created"  # SQL users alike
    assert tenant.apply_sql(doc(3, status="CRON_TABLE_ERROR"))["action"] == "created"
    async with scheduler(db, clock) as s:
        assert await s.run_due() == 0
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
