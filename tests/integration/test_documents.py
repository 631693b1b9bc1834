"""CRON_TABLE documents against a real PostgreSQL: admission, the runner's lifecycle, safety, concurrency.

Time is driven by a controllable clock: the scheduler's "now" (due checks, maintained times, and the
expressions' now()) is a parameter, so no test sleeps to wait for a schedule.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb

from radixjobs import documents
from radixjobs.catalog import LIST_COLUMNS
from radixjobs.documents import DocumentError
from radixjobs.documents.expression import CheckedExpression, EvaluationFailed, check, evaluate
from radixjobs.documents.model import document_num, document_problems
from radixjobs.engine.principals import PrincipalPools
from radixjobs.engine.slots import Slots
from radixjobs.errors import ConfigError
from radixjobs.server import owner as owner_module
from radixjobs.server.owner import DatabaseOwner
from tests.support import SEED, document_counters, document_engine, document_runs, wait_for

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)


WORK_SQL = """
CREATE SCHEMA work;
CREATE TABLE work.archive (id bigserial, who text, at timestamptz DEFAULT clock_timestamp());
CREATE TABLE work.switch (failing boolean NOT NULL);
INSERT INTO work.switch VALUES (false);
CREATE FUNCTION public.archive_logs() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT failing FROM work.switch) THEN RAISE EXCEPTION 'disk full'; END IF;
    INSERT INTO work.archive (who) VALUES (session_user);
END $$;
CREATE PROCEDURE work.archive_proc() LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO work.archive (who) VALUES ('proc:' || session_user);
    COMMIT;  -- transaction control: only possible in a top-level CALL
END $$;
CREATE FUNCTION work.slow() RETURNS void LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock(4242); INSERT INTO work.archive (who) VALUES ('slow'); END $$;
CREATE FUNCTION work.sleepy() RETURNS void LANGUAGE sql AS $$ SELECT pg_sleep(30) $$;
"""


class Clock:
    """A controllable clock: the scheduler's now."""

    def __init__(self, now: dt.datetime = T0):
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


@dataclass
class Tenant:
    """A LOGIN role that writes documents (so they run as it), with schema ``work``."""

    role: str
    dsn: str
    admin: psycopg.Connection[Any]

    def apply(self, docs: Any) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            return documents.apply(c, docs)

    def apply_sql(self, doc: Any) -> Any:
        """Write a document with SQL, as a SQL user would (no Python-side checks)."""
        with psycopg.connect(self.dsn, autocommit=True) as c:
            row = c.execute("SELECT radix.apply_document(%s)", (Jsonb(doc),)).fetchone()
            return row[0] if row else None

    def doc(self, num: Any = 101) -> dict[str, Any]:
        found = documents.get_document(self.admin, num)
        assert found is not None
        return found

    def props(self, num: Any = 101) -> dict[str, Any]:
        return self.doc(num)["props"]

    def processes(self, num: Any = 101) -> list[dict[str, Any]]:
        return list(reversed(documents.list_processes(self.admin, num, 256)))

    def archive(self) -> list[str]:
        return [r[0] for r in self.admin.execute("SELECT who FROM work.archive ORDER BY id").fetchall()]


@pytest.fixture
def tenant(db: str, pg: Any, conn: psycopg.Connection[Any], roles: Any) -> Tenant:
    role = roles("tenant")
    conn.execute(WORK_SQL)
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA work TO {r}; GRANT ALL ON ALL TABLES IN SCHEMA work TO {r}; "
                         "GRANT ALL ON ALL SEQUENCES IN SCHEMA work TO {r}").format(r=sql.Identifier(role)))
    return Tenant(role, pg.dsn_for(conninfo_to_dict(db)["dbname"], user=role), conn)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def doc(num: Any, /, **props: Any) -> dict[str, Any]:
    out = {"dockind": "CRON_TABLE", "status": props.pop("status", "CRON_TABLE_ACTIVE"),
           "props": {"NUM": num, "DB_FUNCTION": "archive_logs", "INTERVAL": "now() + interval '1 hour'"}}
    for key, value in props.items():
        if value is None:
            out["props"].pop(key, None)
        else:
            out["props"][key] = value
    return out


def scheduler(db: str, clock: Clock | None, **kwargs: Any) -> Any:
    kwargs.setdefault("entry_points", False)
    return document_engine(db, clock=clock, **kwargs)


async def eventually(predicate: Callable[[], Any], within: float = 60.0, message: str = "condition") -> Any:
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message}")
        await asyncio.sleep(0.02)


# -- admission ----------------------------------------------------------------------------------------------

BAD_DOCS: list[Any] = [
    [], "text", {}, {"dockind": "INVOICE", "status": "ACTIVE", "props": []}, {**SEED, "extra": 1},
    {**SEED, "status": None}, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ERROR"},
    doc(1.5, DB_FUNCTION="a;b", CSP_SERVICE="", MAX_COUNT_ERROR=-1, FIRST_RUN="soon", foo=1, num=2),
    doc(True, DB_FUNCTION=None), doc("  ", DB_FUNCTION=5, CSP_SERVICE_PARAMS="{"),
    doc(7, DB_FUNCTION=None, CSP_SERVICE="svc", CSP_SERVICE_PARAMS=5, INTERVAL=1, INTERVAL_ERROR=[]),
    doc(8, FIRST_RUN="2025-02-30", RUN_AS="", DESCR=3, MAX_COUNT_ERROR=2147483648),
    doc(9, DB_FUNCTION='"unterminated', FIRST_RUN="2025-01-01Z", Interval="x"),
    doc("x" * 101, DB_FUNCTION="a.b.c", FIRST_RUN="2025-01-01T00:00:00+0300", CSP_SERVICE_PARAMS='"ok"'),
]


def test_database_and_python_name_the_same_problems(conn: psycopg.Connection[Any]) -> None:
    for bad in [SEED, *BAD_DOCS]:
        row = conn.execute("SELECT radix.document_problems(%s), radix.document_num(%s)", (Jsonb(bad), Jsonb(bad)))
        problems, num = row.fetchone() or (None, None)
        assert problems == document_problems(bad), bad
        assert num == document_num(bad), bad
        assert bad is SEED or problems


def test_seed_document_applies_once_and_reapplying_changes_nothing(tenant: Tenant, db: str) -> None:
    assert tenant.apply(SEED) == [{"num": "101", "action": "created", "version": 1, "ignored": []}]
    before = tenant.admin.execute("SELECT updated_at, version FROM radix.cron_table").fetchone()
    with psycopg.connect(db, autocommit=True) as listener:
        listener.execute("LISTEN radix_documents")
        assert tenant.apply(SEED) == [{"num": "101", "action": "unchanged", "version": 1, "ignored": []}]
        assert tenant.apply_sql(SEED)["action"] == "unchanged"
        assert list(listener.notifies(timeout=0.3)) == []
    assert tenant.admin.execute("SELECT updated_at, version FROM radix.cron_table").fetchone() == before
    props = tenant.props()
    assert props["RUN_AS"] == tenant.role  # default principal: the writer
    assert props["COUNT_ERROR"] == 0
    assert props["NEXT_RUN"] is None
    assert props["SYS_PROCESS_ID"] is None


def test_a_list_is_all_or_nothing_with_every_problem_named(tenant: Tenant) -> None:
    docs = [doc(1), doc(2, RUN_AS="nobody_at_all"), doc(3, MAX_COUNT_ERROR=-1), doc(1)]
    with pytest.raises(DocumentError) as python_side:
        tenant.apply(docs)
    assert python_side.value.problems == [
        "document 3 (NUM 3): MAX_COUNT_ERROR must be an integer from 0 to 2147483647",
        "NUM 1 appears more than once (documents 1, 4)"]
    with pytest.raises(DocumentError) as database_side:  # checks only the database can make
        tenant.apply(docs[:2])
    assert database_side.value.problems == ["document 2 (NUM 2): RUN_AS role 'nobody_at_all' does not exist"]
    with pytest.raises(psycopg.errors.InvalidParameterValue) as sql_side:
        tenant.apply_sql(doc(4, MAX_COUNT_ERROR="3", FIRST_RUN="tomorrow"))
    assert sql_side.value.diag.message_detail == (
        "NUM 4: MAX_COUNT_ERROR must be an integer from 0 to 2147483647\n"
        "NUM 4: FIRST_RUN must be an ISO-8601 timestamp such as 2025-01-01T00:00:00, not 'tomorrow'")
    assert tenant.admin.execute("SELECT count(*) FROM radix.cron_table").fetchone() == (0,)


def test_run_as_follows_the_may_act_as_rule(tenant: Tenant, roles: Any, pg: Any, db: str) -> None:
    other = roles("other")
    nologin = roles("nologin", "NOLOGIN")
    for role in (other, nologin):
        tenant.admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(tenant.role)))
    stranger = roles("stranger")
    cases = [("postgres", "permission denied to run as superuser postgres: only superusers may"),
             (stranger, f"permission denied to run as role {stranger}: the writer must be able to SET ROLE"),
             (nologin, f"role {nologin} cannot log in")]
    for run_as, problem in cases:
        with pytest.raises(DocumentError) as refused:
            tenant.apply(doc(1, RUN_AS=run_as))
        assert problem in refused.value.problems[0]
    assert tenant.apply(doc(1, RUN_AS=other))[0]["action"] == "created"
    assert documents.overview(tenant.admin)[0]["principal"] == other
    with psycopg.connect(pg.dsn_for(conninfo_to_dict(db)["dbname"], user=stranger), autocommit=True) as c:
        assert documents.list_documents(c) == []  # not visible to other roles
        with pytest.raises(DocumentError, match="belongs to another role") as not_owner:
            documents.apply(c, doc(1, RUN_AS=stranger))
    assert not_owner.value.code == "42501"


def test_maintained_props_are_ignored_and_show_output_round_trips(tenant: Tenant) -> None:
    result = tenant.apply(doc(5, NEXT_RUN="2030-01-01T00:00:00", COUNT_ERROR=9))
    assert result[0]["ignored"] == ["COUNT_ERROR", "NEXT_RUN"]
    shown = tenant.doc(5)
    assert shown["props"]["NEXT_RUN"] is None
    assert shown["props"]["COUNT_ERROR"] == 0
    assert tenant.apply(shown)[0]["action"] == "unchanged"
    rows = documents.overview(tenant.admin)
    assert [tuple(r) for r in rows] == [LIST_COLUMNS]
    assert rows[0]["name"] == "doc:5"
    assert rows[0]["procedure"] == "archive_logs"
    assert rows[0]["enabled"]


def test_changes_notify_the_schedulers(tenant: Tenant, db: str) -> None:
    with psycopg.connect(db, autocommit=True) as listener:
        listener.execute("LISTEN radix_documents")
        tenant.apply(doc("A-1"))
        assert [n.payload for n in listener.notifies(timeout=60, stop_after=1)] == ["A-1"]
        tenant.admin.execute("INSERT INTO radix.sys_processes (task_num, doc_version, type, target, started_at, "
                             "node) VALUES ('A-1', 1, 'db', 'x', now(), 'n')")
        assert [n.payload for n in listener.notifies(timeout=60, stop_after=1)] == ["A-1"]
    names = tenant.admin.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE 'trg%' ORDER BY 1").fetchall()
    assert names == [("trgCronTableChanged",), ("trgProcessChanged",)]


# -- the lifecycle ------------------------------------------------------------------------------------------

async def test_seed_example_lifecycle(tenant: Tenant, db: str, clock: Clock) -> None:
    tenant.apply(SEED)
    clock.now = T0 - HOUR
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 0  # FIRST_RUN is an hour away
        assert await s.work.next_due_in() == 3600.0
        clock.now = T0
        assert await document_runs(s) == 1
        props = tenant.props()
        assert (props["COUNT_ERROR"], props["LAST_RUN"], props["NEXT_RUN"], props["ERROR_TEXT"]) == (
            0, T0.isoformat(), (T0 + HOUR).isoformat(), None)
        assert props["SYS_PROCESS_ID"] is None
        assert props["DAILY_START_TIME"] == T0.isoformat()
        assert tenant.archive() == [tenant.role]  # ran as the document's principal

        tenant.admin.execute("UPDATE work.switch SET failing = true")
        for count, at in enumerate([T0 + HOUR, T0 + HOUR + 5 * MINUTE, T0 + HOUR + 10 * MINUTE], 1):
            clock.now = at
            assert await document_runs(s) == 1
            props = tenant.props()
            assert props["COUNT_ERROR"] == count
            assert "disk full" in props["ERROR_TEXT"]
            if count < 3:
                assert tenant.doc()["status"] == "CRON_TABLE_ACTIVE"
                assert props["NEXT_RUN"] == (at + 5 * MINUTE).isoformat()  # INTERVAL_ERROR
        assert tenant.doc()["status"] == "CRON_TABLE_ERROR"
        assert props["NEXT_RUN"] is None
        assert "reached MAX_COUNT_ERROR 3" in props["ERROR_TEXT"]
        clock.now = T0 + 5 * HOUR
        assert await document_runs(s) == 0  # stopped

        tenant.admin.execute("UPDATE work.switch SET failing = false")
        assert tenant.apply(SEED)[0]["action"] == "updated"  # ACTIVE again: re-armed
        props = tenant.props()
        assert (props["COUNT_ERROR"], props["ERROR_TEXT"], props["NEXT_RUN"]) == (0, None, None)
        assert await document_runs(s) == 1
        props = tenant.props()
        assert (props["COUNT_ERROR"], props["NEXT_RUN"]) == (0, (clock.now + HOUR).isoformat())
        assert document_counters(s) == {"doc_runs": 5, "doc_successes": 2, "doc_failures": 3, "doc_passive": 0,
                              "doc_errors": 1, "doc_restarts": 0}
    assert [p["status"] for p in tenant.processes()] == ["completed", "failed", "failed", "failed", "completed"]
    assert len(tenant.archive()) == 2


async def test_seed_expression_examples_give_the_expected_times(tenant: Tenant) -> None:
    now = dt.datetime(2025, 3, 14, 15, 9, 26, tzinfo=dt.UTC)
    examples = {
        "NOW() + INTERVAL '5 minutes'": now + 5 * MINUTE,
        "NOW() + INTERVAL '1 hour'": now + HOUR,
        "DATE_TRUNC('day', NOW()) + INTERVAL '1 day' + INTERVAL '3 hours'": dt.datetime(2025, 3, 15, 3, tzinfo=dt.UTC),
        "NOW() + INTERVAL '1 day'": now + 24 * HOUR,
        # docs/documents.md: the PostgreSQL way to say NEXT_DAY(NOW(), 'MONDAY') + 9 hours, and a time zone
        "date_trunc('week', now()) + interval '1 week 9 hours'": dt.datetime(2025, 3, 17, 9, tzinfo=dt.UTC),
        "(date_trunc('day', now() AT TIME ZONE 'Europe/Moscow') + interval '1 day 3 hours') "
        "AT TIME ZONE 'Europe/Moscow'": dt.datetime(2025, 3, 15, tzinfo=dt.UTC),
    }
    async with await psycopg.AsyncConnection.connect(tenant.dsn, autocommit=True) as c:
        for text, expected in examples.items():
            assert await evaluate(c, check(text), now) == expected, text


async def test_next_day_makes_the_task_passive_with_a_clear_reason(tenant: Tenant, db: str, clock: Clock) -> None:
    next_day = "NEXT_DAY(NOW(), 'MONDAY') + INTERVAL '9 hours'"
    with pytest.raises(DocumentError, match=r"INTERVAL is refused: function next_day\(\) is not allowed"):
        tenant.apply(doc(1, INTERVAL=next_day))  # the CLI and Python API refuse it up front
    tenant.apply_sql(doc(1, INTERVAL=next_day))  # SQL users get it PASSIVE when it is first needed
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
        assert s.counters["doc_passive"] == 1
    found = tenant.doc(1)
    assert found["status"] == "CRON_TABLE_PASSIVE"
    assert found["props"]["ERROR_TEXT"].startswith(
        "INTERVAL: refused: function next_day() is not allowed (allowed: abs, ")
    assert found["props"]["ERROR_TEXT"].endswith("; the task is now passive")


@pytest.mark.parametrize(("interval", "reason"), [
    (None, "INTERVAL: the expression is empty (no INTERVAL: the task ran once); the task is now passive"),
    ("now() - interval '1 minute'", "is not after the run's end"),
    ("NULL::timestamptz", "INTERVAL: the value is NULL"),
    ("now() + interval 'ten minutes'", "INTERVAL: evaluation failed: [22007] invalid input syntax"),
    ("'infinity'::timestamptz", "the value is not a finite time"),
])
async def test_no_usable_next_time_makes_the_task_passive(tenant: Tenant, db: str, clock: Clock,
                                                          interval: str | None, reason: str) -> None:
    tenant.apply_sql(doc(1, INTERVAL=interval))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
        clock.now += 24 * HOUR
        assert await document_runs(s) == 0  # ran once
    found = tenant.doc(1)
    assert found["status"] == "CRON_TABLE_PASSIVE"
    assert reason in found["props"]["ERROR_TEXT"]
    assert found["props"]["NEXT_RUN"] is None
    assert tenant.archive() == [tenant.role]


async def test_edits_keep_the_run_state_and_reactivation_rearms(tenant: Tenant, db: str, clock: Clock) -> None:
    tenant.apply(doc(1, FIRST_RUN="2024-12-31T00:00:00"))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
        state = tenant.props(1)
        assert tenant.apply(doc(1, FIRST_RUN="2024-12-31T00:00:00", DESCR="renamed"))[0]["version"] == 2
        kept = tenant.props(1)
        assert (kept["LAST_RUN"], kept["NEXT_RUN"], kept["DESCR"]) == (state["LAST_RUN"], state["NEXT_RUN"],
                                                                       "renamed")
        tenant.apply(doc(1, FIRST_RUN="2024-12-31T00:00:00", DESCR="renamed", status="CRON_TABLE_PASSIVE"))
        clock.now += 2 * HOUR
        assert await document_runs(s) == 0  # any status but ACTIVE disables it
        tenant.apply(doc(1, FIRST_RUN="2024-12-31T00:00:00", DESCR="renamed"))
        assert tenant.props(1)["NEXT_RUN"] is None  # re-armed: due at once (FIRST_RUN has passed)
        assert await document_runs(s) == 1


async def test_db_function_forms_and_failures(tenant: Tenant, db: str, clock: Clock) -> None:
    tenant.apply([doc(1, DB_FUNCTION="work.archive_proc"), doc(2, DB_FUNCTION="work.no_such_function"),
                  doc(3, DB_FUNCTION="work.sleepy"), doc(4, DB_FUNCTION='"public"."ARCHIVE_LOGS"')])
    async with scheduler(db, clock, db_timeout_s=0.5) as s:
        assert await document_runs(s) == 4
    assert tenant.archive() == [f"proc:{tenant.role}"]  # a procedure is CALLed (and may COMMIT)
    assert tenant.props(2)["ERROR_TEXT"].startswith('[42883] function "work"."no_such_function"() does not exist')
    assert tenant.props(3)["ERROR_TEXT"].startswith("DB_FUNCTION timed out after 0.5 s")
    assert tenant.props(4)["ERROR_TEXT"].startswith('[42883] function "public"."ARCHIVE_LOGS"()')
    active = tenant.admin.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%sleepy%' "
                                  "AND pid <> pg_backend_pid()").fetchone()
    assert active == (0,)  # the timed-out session was ended


async def test_revoked_run_as_fails_the_run_and_stops_the_task(tenant: Tenant, db: str, clock: Clock,
                                                               roles: Any) -> None:
    other = roles("other")
    tenant.admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(other), sql.Identifier(tenant.role)))
    tenant.apply(doc(1, RUN_AS=other))
    tenant.admin.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(other), sql.Identifier(tenant.role)))
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == 1
    found = tenant.doc(1)
    assert found["status"] == "CRON_TABLE_PASSIVE"
    assert tenant.archive() == []
    assert found["props"]["ERROR_TEXT"].startswith(
        "permission denied: the document's writer may no longer act as RUN_AS; INTERVAL: cannot evaluate")


# -- safety of expressions ------------------------------------------------------------------------------------

INJECTIONS = [
    "now()); DROP TABLE app.victim; SELECT (now()",
    "now(); DROP TABLE app.victim",
    "now()) FROM app.secrets WHERE s::int > 0 --",
    # sub-queries read the principal's tables (test_documents_seed.py), but never lock, write or call more
    "(SELECT max(s) FROM app.secrets FOR UPDATE)::timestamptz",
    "now() + (SELECT count(*) FROM app.secrets WHERE pg_sleep(600) IS NULL) * interval '1 day'",
    "(WITH gone AS (DELETE FROM app.victim RETURNING x) SELECT max(x) FROM gone)::text::timestamptz",
    "now() + pg_sleep(600)::text::interval",
    "nextval('app.seq')::text::timestamptz",
]
# the principal's own functions, schema-qualified, are accepted (issue #12): they run read-only, as it
OWN_WRITERS = ["public.now()", "app.next_slot()"]

TRAP_SQL = """
CREATE SCHEMA app;
CREATE TABLE app.victim (x int); INSERT INTO app.victim VALUES (1);
CREATE TABLE app.secrets (s text); INSERT INTO app.secrets VALUES ('hunter2');
CREATE SEQUENCE app.seq;
CREATE TABLE app.writes (x int);
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql AS
    $$ INSERT INTO app.writes VALUES (1) RETURNING pg_catalog.now() + interval '1 hour' $$;
CREATE FUNCTION app.next_slot() RETURNS timestamptz LANGUAGE sql AS
    $$ INSERT INTO app.writes VALUES (2) RETURNING pg_catalog.now() + interval '1 hour' $$;
"""


async def test_injection_attempts_are_refused_and_nothing_executes(tenant: Tenant, db: str, clock: Clock) -> None:
    tenant.admin.execute(TRAP_SQL)
    tenant.admin.execute(sql.SQL("GRANT ALL ON SCHEMA app TO {r}; GRANT ALL ON ALL TABLES IN SCHEMA app TO {r}; "
                                 "GRANT ALL ON ALL SEQUENCES IN SCHEMA app TO {r}").format(
                                     r=sql.Identifier(tenant.role)))
    for n, payload in enumerate(INJECTIONS, 1):
        with pytest.raises(DocumentError, match="INTERVAL is refused"):
            tenant.apply(doc(n, INTERVAL=payload))
        tenant.apply_sql(doc(n, INTERVAL=payload))
    for n, payload in enumerate(OWN_WRITERS, len(INJECTIONS) + 1):
        tenant.apply(doc(n, INTERVAL=payload))
    started = time.monotonic()
    async with scheduler(db, clock) as s:
        assert await document_runs(s) == len(INJECTIONS) + len(OWN_WRITERS)
    assert time.monotonic() - started < 120  # pg_sleep(600) never ran
    for n in range(1, len(INJECTIONS) + 1):
        found = tenant.doc(n)
        assert found["status"] == "CRON_TABLE_PASSIVE", found
        assert "INTERVAL: refused: " in found["props"]["ERROR_TEXT"]
        assert "hunter2" not in found["props"]["ERROR_TEXT"]
    for n in range(len(INJECTIONS) + 1, len(INJECTIONS) + len(OWN_WRITERS) + 1):
        found = tenant.doc(n)
        assert found["status"] == "CRON_TABLE_PASSIVE", found
        assert "INTERVAL: evaluation failed: [25006]" in found["props"]["ERROR_TEXT"]  # read-only
    assert tenant.admin.execute("SELECT count(*) FROM app.victim").fetchone() == (1,)
    assert tenant.admin.execute("SELECT is_called FROM app.seq").fetchone() == (False,)
    assert tenant.admin.execute("SELECT count(*) FROM app.writes").fetchone() == (0,)


async def test_evaluation_is_read_only_bounded_and_leaves_a_clean_session(tenant: Tenant, db: str) -> None:
    tenant.admin.execute(TRAP_SQL)
    tenant.admin.execute(sql.SQL("GRANT ALL ON SCHEMA app TO {r}; GRANT ALL ON ALL SEQUENCES IN SCHEMA app TO {r}")
                         .format(r=sql.Identifier(tenant.role)))
    # defence in depth: statements the checker would refuse, run straight through the guard
    unchecked = {
        "SELECT CAST($1 AS timestamptz) + nextval('app.seq') * interval '1 s'": "[25006]",
        "SELECT CAST($1 AS timestamptz); DROP TABLE app.victim": "[42601]",
        "SELECT CAST($1 AS timestamptz) + count(*) * interval '1 s' FROM generate_series(1, 500000000)": "[57014]",
    }
    pools = PrincipalPools(db, max_idle=1)
    try:
        for text, state in unchecked.items():
            async with pools.connection(tenant.role) as c:
                with pytest.raises(EvaluationFailed) as failed:
                    await evaluate(c, CheckedExpression(text, text), T0, timeout_ms=300)
                assert str(failed.value).startswith(state), failed.value
        async with pools.connection(tenant.role) as c:  # the same, cleaned connection
            cur = await c.execute("SELECT current_setting('statement_timeout'), current_setting('search_path'), "
                                  "current_setting('transaction_read_only')")
            assert await cur.fetchone() == ("0", '"$user", public', "off")
    finally:
        await pools.close()
    assert tenant.admin.execute("SELECT count(*) FROM app.victim").fetchone() == (1,)
    assert tenant.admin.execute("SELECT is_called FROM app.seq").fetchone() == (False,)


# -- CSP services -----------------------------------------------------------------------------------------------

def record_params(params: Any) -> None:
    """A CSP service for the tests: writes its parameters to params["path"]."""
    Path(params["path"]).write_text(json.dumps(params), encoding="utf-8")


SERVICES = {"raises": "json:loads", "exits": "os:_exit", "hangs": "time:sleep", "records": record_params}


async def test_csp_services_fail_alone(tenant: Tenant, db: str, clock: Clock, tmp_path: Path) -> None:
    out = tmp_path / "params.json"
    for service in (*SERVICES, "not_registered"):  # the operator lets the tenant use them
        tenant.admin.execute("SELECT radix.grant_service(%s, %s)", (service, tenant.role))
    tenant.apply([
        doc("raise", DB_FUNCTION=None, CSP_SERVICE="raises", CSP_SERVICE_PARAMS='"not json"'),
        doc("exit", DB_FUNCTION=None, CSP_SERVICE="exits", CSP_SERVICE_PARAMS="3"),
        doc("unknown", DB_FUNCTION=None, CSP_SERVICE="not_registered"),
        doc("ok", DB_FUNCTION=None, CSP_SERVICE="records", CSP_SERVICE_PARAMS={"path": str(out), "n": 1}),
    ])
    async with scheduler(db, clock, services=SERVICES, service_timeout_s=60) as s:
        assert await document_runs(s) == 4
        assert (s.counters["doc_successes"], s.counters["doc_failures"]) == (1, 3), s.work.last_error
    tenant.apply(doc("hang", DB_FUNCTION=None, CSP_SERVICE="hangs", CSP_SERVICE_PARAMS="60"))
    async with scheduler(db, clock, services=SERVICES, service_timeout_s=1.5) as s:
        assert await document_runs(s) == 1
    errors = {num: tenant.props(num)["ERROR_TEXT"] for num in ("raise", "exit", "hang", "unknown", "ok")}
    assert errors["raise"].startswith("CSP service 'raises': JSONDecodeError: Expecting value")
    assert errors["exit"] == "CSP service 'exits': the worker process exited with code 3 without a result"
    assert errors["hang"] == "CSP service 'hangs' timed out after 1.5 s: worker killed"
    assert errors["unknown"] == "CSP service 'not_registered' is not registered with this scheduler"
    assert errors["ok"] is None
    assert json.loads(out.read_text(encoding="utf-8")) == {"path": str(out), "n": 1}
    assert tenant.processes("ok")[0]["params"] == {"path": str(out), "n": 1}
    assert [tenant.processes(n)[0]["status"] for n in ("raise", "ok")] == ["failed", "completed"]
    assert tenant.props("raise")["NEXT_RUN"] == (T0 + HOUR).isoformat()  # no INTERVAL_ERROR: INTERVAL


# -- concurrency and recovery -------------------------------------------------------------------------------

@pytest.fixture
def blocker(db: str) -> Iterator[psycopg.Connection[Any]]:
    """Holds advisory lock 4242, on which work.slow() waits, until released."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT pg_advisory_lock(4242)")
        yield c


def running(tenant: Tenant, num: Any) -> bool:
    return any(p["status"] == "running" for p in tenant.processes(num))


async def test_edits_while_the_task_runs(tenant: Tenant, db: str, clock: Clock,
                                         blocker: psycopg.Connection[Any]) -> None:
    tenant.apply([doc(1, DB_FUNCTION="work.slow"), doc(2, DB_FUNCTION="work.slow")])
    async with scheduler(db, clock) as s:
        run = asyncio.create_task(document_runs(s))
        await eventually(lambda: running(tenant, 1) and running(tenant, 2), message="both running")
        # edits never wait for a running task
        assert tenant.apply(doc(1, DB_FUNCTION="work.slow", INTERVAL="now() + interval '2 hours'"))[0]["version"] == 2
        tenant.apply(doc(2, DB_FUNCTION="work.slow", status="CRON_TABLE_PASSIVE"))
        assert tenant.props(1)["SYS_PROCESS_ID"] is not None
        blocker.execute("SELECT pg_advisory_unlock(4242)")
        assert await run == 2
    first, second = tenant.doc(1), tenant.doc(2)
    assert (first["status"], first["props"]["NEXT_RUN"]) == ("CRON_TABLE_ACTIVE", (T0 + 2 * HOUR).isoformat())
    assert first["props"]["SYS_PROCESS_ID"] is None
    assert first["props"]["COUNT_ERROR"] == 0
    assert second["status"] == "CRON_TABLE_PASSIVE"  # the user's status wins over the finish
    assert second["props"]["SYS_PROCESS_ID"] is None
    assert second["props"]["LAST_RUN"] == T0.isoformat()


async def test_an_edit_between_evaluation_and_finish_is_decided_again(tenant: Tenant, db: str,
                                                                      clock: Clock) -> None:
    tenant.apply(doc(1))
    async with scheduler(db, clock) as s:
        evaluate_next = s.work._finisher.next_time
        calls = []

        async def edit_first(plan: Any, state: Any, now: dt.datetime) -> Any:
            calls.append(plan.expression_text)
            if len(calls) == 1:
                tenant.apply(doc(1, INTERVAL="now() + interval '3 hours'"))
            return await evaluate_next(plan, state, now)

        s.work._finisher.next_time = edit_first  # type: ignore[method-assign]
        assert await document_runs(s) == 1
    assert calls == ["now() + interval '1 hour'", "now() + interval '3 hours'"]
    assert tenant.props(1)["NEXT_RUN"] == (T0 + 3 * HOUR).isoformat()


async def test_two_schedulers_never_run_one_task_twice(tenant: Tenant, db: str, clock: Clock) -> None:
    tenant.apply([doc(n) for n in range(1, 13)])
    async with scheduler(db, clock, node_id="node-a") as a, scheduler(db, clock, node_id="node-b") as b:
        for _ in range(3):
            runs = await asyncio.gather(document_runs(a), document_runs(b))
            assert sum(runs) == 12
            clock.now += HOUR
    counts = tenant.admin.execute("SELECT task_num, count(*), count(DISTINCT doc_version), bool_and(status = "
                                  "'completed') FROM radix.sys_processes GROUP BY 1").fetchall()
    assert len(counts) == 12
    assert all(c[1:] == (3, 1, True) for c in counts), counts  # each task: 3 runs, never one twice
    assert a.counters["doc_runs"] + b.counters["doc_runs"] == 36


def record_process(tenant: Tenant, num: Any, node: str, status: str = "running", error: str | None = None) -> int:
    row = tenant.admin.execute(
        "INSERT INTO radix.sys_processes (task_num, doc_version, type, target, started_at, node, status, "
        "error_text, finished_at) VALUES (%s, 1, 'db', 'archive_logs', %s, %s, %s, %s, "
        "CASE WHEN %s <> 'running' THEN %s::timestamptz END) RETURNING id",
        (str(num), T0, node, status, error, status, T0 + MINUTE)).fetchone()
    assert row is not None
    tenant.admin.execute("UPDATE radix.cron_table SET sys_process_id = %s, daily_start_time = %s WHERE num = %s",
                         (row[0], T0, str(num)))
    return int(row[0])


def dead_node(tenant: Tenant, db: str, node: str) -> None:
    """Register ``node`` from a session that then ends: the node is dead."""
    with psycopg.connect(db, autocommit=True) as gone:
        gone.execute("SELECT radix.register_node(%s, 'nowhere', 1)", (node,))
    wait_for(lambda: tenant.admin.execute("SELECT radix.node_alive(%s)", (node,)).fetchone() == (False,),
             message=f"node {node}'s session to end")


async def test_a_process_whose_node_died_is_run_again(tenant: Tenant, db: str, clock: Clock) -> None:
    tenant.apply([doc(1), doc(2)])
    dead_node(tenant, db, "ghost")
    ghost = record_process(tenant, 1, "ghost")
    alive = record_process(tenant, 2, "alive")
    with psycopg.connect(db, autocommit=True) as holder:
        holder.execute("SELECT radix.register_node('alive', 'h', 2)")  # alive while this session is
        async with scheduler(db, clock) as s:
            assert await document_runs(s) == 1  # only the dead node's task
            assert s.counters["doc_restarts"] == 1
        assert tenant.props(2)["SYS_PROCESS_ID"] == alive  # running on a live node: left alone
    old = tenant.processes(1)[0]
    assert (old["id"], old["status"]) == (ghost, "failed")
    assert old["error_text"] == "abandoned: node ghost stopped before the process finished"
    assert [p["status"] for p in tenant.processes(1)] == ["failed", "completed"]
    assert tenant.props(1)["SYS_PROCESS_ID"] is None
    assert tenant.props(1)["COUNT_ERROR"] == 0
    async with scheduler(db, clock) as s:  # the live node went away with its session
        assert await document_runs(s) == 1


async def test_recorded_outcomes_are_finished_and_lost_processes_rerun(tenant: Tenant, db: str,
                                                                       clock: Clock) -> None:
    tenant.apply([doc(1), doc(2), doc(3), doc(4)])
    record_process(tenant, 1, "gone", "completed")
    record_process(tenant, 2, "gone", "failed", "out of memory")
    tenant.admin.execute("UPDATE radix.cron_table SET sys_process_id = 999999 WHERE num = '3'")
    node = "docs-self"
    record_process(tenant, 4, node)  # this node's own earlier life: not running here any more
    async with scheduler(db, clock, node_id=node) as s:
        assert await document_runs(s) == 2  # 3 (process not found) and 4 (own stale process)
        assert s.counters["doc_restarts"] == 2
    one, two = tenant.props(1), tenant.props(2)
    assert (one["COUNT_ERROR"], one["NEXT_RUN"], one["SYS_PROCESS_ID"]) == (0, (T0 + HOUR).isoformat(), None)
    assert (two["COUNT_ERROR"], two["ERROR_TEXT"]) == (1, "out of memory")
    assert one["DAILY_END_TIME"] == (T0 + MINUTE).isoformat()
    assert [p["status"] for p in tenant.processes(4)] == ["failed", "completed"]


async def test_inactive_tasks_release_lost_processes_on_reload(tenant: Tenant, db: str, clock: Clock) -> None:
    tenant.apply(doc(1))
    dead_node(tenant, db, "ghost")
    record_process(tenant, 1, "ghost")
    tenant.apply(doc(1, status="CRON_TABLE_PASSIVE"))
    async with scheduler(db, clock) as s:
        assert await s.work.reload() == 1
    assert tenant.props(1)["SYS_PROCESS_ID"] is None
    assert tenant.processes(1)[0]["status"] == "failed"


async def test_serve_picks_up_changes_at_once_and_starts_on_time(tenant: Tenant, db: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # no poll or periodic check within the test's minute: only the notification and the timer start the runs
    monkeypatch.setattr(owner_module, "Documents", functools.partial(
        owner_module.Documents, check_period_s=3600.0, reload_period_s=3600.0))
    owner = DatabaseOwner("docs", db, node_id="serving", slots=Slots(8), concurrency=8, poll_s=3600.0)
    serving = asyncio.create_task(owner.run())
    await eventually(lambda: owner.connected, within=60, message="the owner to serve")
    tenant.apply(doc(1))  # due now: the notification wakes the engine
    await eventually(lambda: tenant.props(1)["LAST_RUN"] is not None, within=60, message="run of 1")
    first_run = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1.5)
    tenant.apply(doc(2, FIRST_RUN=first_run.isoformat()))  # due soon: the timer starts it
    await eventually(lambda: tenant.props(2)["LAST_RUN"] is not None, within=60, message="run of 2")
    owner.stop()
    await serving
    started = dt.datetime.fromisoformat(tenant.props(2)["LAST_RUN"])
    assert first_run <= started  # not early, and (the hour-long poll and check) started by the timer


async def test_node_id_in_use_is_refused(db: str) -> None:
    async with scheduler(db, None, node_id="same"):
        with pytest.raises(ConfigError, match="already alive"):
            async with scheduler(db, None, node_id="same"):
                pass
