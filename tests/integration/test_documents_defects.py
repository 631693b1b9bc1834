"""DocScheduler defects found in real deployments (issue #12), against a real PostgreSQL.

``NOW()`` as INTERVAL is not a schedule (it ran ~46 times a second); a DB_FUNCTION whose parameters are all
defaulted runs; a RUN_AS that cannot log in counts towards MAX_COUNT_ERROR instead of going PASSIVE at once;
the widened expression language evaluates as the principal, its own qualified functions included; a CSP
service's outcome is decided once.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from radixjobs import documents
from radixjobs.documents import DocumentError, services
from radixjobs.documents.services import call_blocking
from tests.integration.test_documents import Clock, Tenant, clock, doc, scheduler, tenant
from tests.support import document_runs

__all__ = ["clock", "tenant"]  # fixtures

DEFAULTED_SQL = """
CREATE FUNCTION work.defaulted(who text DEFAULT 'defaulted', n int DEFAULT 1) RETURNS int LANGUAGE sql AS
$$ INSERT INTO work.archive (who) VALUES (who || n) RETURNING 1 $$;
CREATE PROCEDURE work.defaulted_proc(who text DEFAULT 'proc-defaulted') LANGUAGE sql AS
$$ INSERT INTO work.archive (who) VALUES (who) $$;
CREATE FUNCTION work.ambiguous(a int DEFAULT 1) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION work.ambiguous(b text DEFAULT 'x') RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION work.needs_one(a int) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION work.next_slot(t timestamptz) RETURNS timestamptz LANGUAGE sql STABLE AS
$$ SELECT date_trunc('hour', t) + interval '2 hours' $$;
"""


@pytest.fixture
def work(tenant: Tenant) -> Tenant:
    tenant.admin.execute(DEFAULTED_SQL)
    tenant.admin.execute(sql.SQL("GRANT ALL ON ALL FUNCTIONS IN SCHEMA work TO {}; "
                                 "GRANT ALL ON ALL PROCEDURES IN SCHEMA work TO {}").format(
        sql.Identifier(tenant.role), sql.Identifier(tenant.role)))
    return tenant


async def test_now_as_interval_runs_once_and_goes_passive(work: Tenant, db: str, clock: Clock) -> None:
    work.apply(doc(1, INTERVAL="NOW()"))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
        assert await document_runs(s) == 0  # not due again at once: no run loop
    found = work.doc(1)
    assert found["status"] == "CRON_TABLE_PASSIVE"
    assert "is not after the run's end" in found["props"]["ERROR_TEXT"]
    assert work.archive() == [work.role]


@pytest.mark.parametrize(("target", "effect"), [("work.defaulted", "defaulted1"),
                                                ("work.defaulted_proc", "proc-defaulted")])
async def test_db_function_with_every_parameter_defaulted(work: Tenant, db: str, clock: Clock, target: str,
                                                          effect: str) -> None:
    work.apply(doc(1, DB_FUNCTION=target))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
    props = work.props(1)
    assert props["ERROR_TEXT"] is None, props
    assert props["COUNT_ERROR"] == 0
    assert work.archive() == [effect]


@pytest.mark.parametrize(("target", "error"), [
    ("work.ambiguous", "[42725]"),  # PostgreSQL's own verdict: not unique
    ("work.needs_one", "[42883] function \"work\".\"needs_one\"() does not exist"),
])
async def test_db_function_not_callable_without_arguments(work: Tenant, db: str, clock: Clock, target: str,
                                                          error: str) -> None:
    work.apply(doc(1, DB_FUNCTION=target))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
    props = work.props(1)
    assert props["ERROR_TEXT"].startswith(error), props
    assert props["COUNT_ERROR"] == 1


async def test_nologin_principal_counts_errors_up_to_max_count_error(work: Tenant, db: str, clock: Clock) -> None:
    work.apply(doc(1, MAX_COUNT_ERROR=3, INTERVAL_ERROR="now() + interval '5 minutes'"))
    work.admin.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(work.role)))
    async with scheduler(db, clock, refusal_retry_s=60) as s:
        for count in (1, 2):
            assert await document_runs(s) == 1
            found = work.doc(1)
            assert found["status"] == "CRON_TABLE_ACTIVE", found
            assert found["props"]["COUNT_ERROR"] == count
            assert f"role {work.role} cannot log in" in found["props"]["ERROR_TEXT"]
            assert "tried again at" in found["props"]["ERROR_TEXT"]
            assert found["props"]["NEXT_RUN"] == (clock.now + dt.timedelta(seconds=60)).isoformat()
            assert await document_runs(s) == 0
            clock.now += dt.timedelta(seconds=61)
        assert await document_runs(s) == 1
    found = work.doc(1)
    assert found["status"] == "CRON_TABLE_ERROR"
    assert "COUNT_ERROR 3 reached MAX_COUNT_ERROR 3" in found["props"]["ERROR_TEXT"]
    assert work.archive() == []


async def test_nologin_then_login_again_resumes(work: Tenant, db: str, clock: Clock) -> None:
    work.apply(doc(1))
    work.admin.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(work.role)))
    async with scheduler(db, clock, refusal_retry_s=60) as s:
        assert await document_runs(s) == 1
        work.admin.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(work.role)))
        clock.now += dt.timedelta(seconds=61)
        assert await document_runs(s) == 1
    found = work.doc(1)
    assert (found["status"], found["props"]["COUNT_ERROR"], found["props"]["ERROR_TEXT"]) == (
        "CRON_TABLE_ACTIVE", 0, None)
    assert work.archive() == [work.role]


@pytest.mark.parametrize(("interval", "expected"), [
    ("CASE WHEN to_char(now(), 'Dy') IN ('Sat', 'Sun') THEN now() + interval '2 days' "
     "ELSE now() + interval '1 hour' END", "2025-01-01T01:00:00+00:00"),  # T0 is a Wednesday
    ("CASE WHEN to_char(now(), 'Day') LIKE 'Wed%' THEN now() + interval '3 hours' END", "2025-01-01T03:00:00+00:00"),
    ("CASE WHEN now()::date IS DISTINCT FROM date '2024-12-31' THEN now() + age(timestamp '2025-01-01', "
     "timestamp '2024-12-31') END", "2025-01-02T00:00:00+00:00"),
    ("now() + age(timestamp '2024-12-31')", "2025-01-02T00:00:00+00:00"),  # counted from the scheduler's now
    ("work.next_slot(now())", "2025-01-01T02:00:00+00:00"),
])
async def test_widened_expressions_evaluate_as_the_principal(work: Tenant, db: str, clock: Clock, interval: str,
                                                             expected: str) -> None:
    work.apply(doc(1, INTERVAL=interval))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
    found = work.doc(1)
    assert (found["status"], found["props"]["NEXT_RUN"]) == ("CRON_TABLE_ACTIVE", expected), found


# -- CSP: an outcome decided once ------------------------------------------------------------------------
def _late(params: Any) -> None:
    """Writes its effect, then takes ``sleep`` seconds more."""
    Path(params["marker"]).write_text("done")
    time.sleep(params["sleep"])


def test_csp_timeout_is_decided_once_without_traceback(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    spec = f"{__name__}:_late"
    quick = call_blocking("late", spec, {"marker": str(tmp_path / "quick"), "sleep": 0}, timeout_s=30)
    assert quick.ok, quick
    slow = call_blocking("late", spec, {"marker": str(tmp_path / "slow"), "sleep": 30}, timeout_s=2)
    assert not slow.ok
    assert "timed out after 2 s: worker killed" in (slow.error or "")
    cancel = threading.Event()
    cancel.set()
    cancelled = call_blocking("late", spec, {"marker": str(tmp_path / "c"), "sleep": 30}, timeout_s=30,
                              cancel=cancel)
    assert "cancelled" in (cancelled.error or "")
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


def test_a_worker_whose_scheduler_stopped_listening_ends_quietly(tmp_path: Path) -> None:
    """The result of a service finishing after the verdict goes nowhere: no BrokenPipeError, no traceback."""
    receiver, sender = multiprocessing.Pipe(duplex=False)
    receiver.close()
    services._serve_call(f"{__name__}:_late", {"marker": str(tmp_path / "m"), "sleep": 0}, sender)
    assert (tmp_path / "m").read_text() == "done"
    receiver, sender = multiprocessing.Pipe(duplex=False)
    receiver.close()
    services._serve_call("no_such_module_here:f", None, sender)  # the error report goes nowhere quietly too


@pytest.mark.parametrize(("value", "kind"), [("str", "a string"), (42, "a number"), (None, "null"),
                                             (True, "a boolean"), (1.5, "a number")])
def test_the_python_api_refuses_a_json_scalar_whole(work: Tenant, value: Any, kind: str) -> None:
    """A string is never split into characters ("str" was read as three documents)."""
    with psycopg.connect(work.dsn, autocommit=True) as c, pytest.raises(DocumentError) as refused:
        documents.apply(c, value)
    assert refused.value.problems == [f"expected one document (a JSON object) or a list of them, not {kind}"]
    assert work.admin.execute("SELECT count(*) FROM radix.cron_table").fetchone() == (0,)
