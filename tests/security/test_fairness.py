"""Starvation: one principal's past-due work must not take every slot (docs/security.md "Fair claims").

The attack (red team, item 4): claims went strictly by oldest due time and a job may be due in 1970, so a
tenant whose jobs are due in 1970, sleep, and each schedule more of themselves held every slot, and the
victim's job never ran. Now a claim deals slots round-robin among principals with due work (fewest running
first, then oldest due tick) and a principal with ``max_per_principal`` attempts running in the database
(every node counted) gets no more.

Every hostile job here is created by the hostile role itself through radix.create_job, and its procedure
creates more of them, as in the attack. Waits are on conditions, bounded.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from radixjobs import documents
from radixjobs.documents import DocumentScheduler
from radixjobs.engine import Engine
from radixjobs.fairness import fair_order, principal_cap
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.support import PgCluster, wait_for

# The hostile procedure: records its run, schedules two more of itself due in 1970 (bounded here so the
# test database stays small), then holds its slot.
HOSTILE_SQL = """
CREATE TABLE hostile.runs (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE PROCEDURE hostile.spawn(hold_s integer) LANGUAGE plpgsql AS $$
DECLARE
    radix_args jsonb := jsonb_build_array(jsonb_build_object('kind', 'integer', 'value', hold_s::text));
BEGIN
    INSERT INTO hostile.runs DEFAULT VALUES;
    IF (SELECT count(*) FROM radix.job_overview) < 60 THEN
        PERFORM radix.create_job('hostile.j' || md5(random()::text), '{"at": "1970-01-01T00:00:00Z"}',
                                 session_user, 'hostile.spawn', radix_args);
        PERFORM radix.create_job('hostile.j' || md5(random()::text), '{"at": "1970-01-01T00:00:00Z"}',
                                 session_user, 'hostile.spawn', radix_args);
    END IF;
    PERFORM pg_sleep(hold_s);
END $$;
"""
VICTIM_SQL = """
CREATE TABLE victim.runs (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE PROCEDURE victim.work() LANGUAGE sql BEGIN ATOMIC INSERT INTO victim.runs DEFAULT VALUES; END;
"""
RUNNING_BY = ("SELECT count(*) FROM radix.radix_system_job_state s JOIN radix.jobs j USING (job_id) "
              "WHERE s.status = 'running' AND j.principal_name = %s")


@dataclass
class Tenants:
    """A hostile and a victim principal, each with its own schema in the test database."""

    db: str
    conn: psycopg.Connection[Any]  # superuser, for observing only
    hostile: str
    victim: str
    dsn_as: Callable[[str], str]

    def as_role(self, role: str) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn_as(role), autocommit=True)

    def attack(self, jobs: int, hold_s: int) -> None:
        """The hostile role schedules ``jobs`` jobs due in 1970, each holding its slot ``hold_s`` seconds."""
        with self.as_role(self.hostile) as c:
            for _ in range(jobs):
                c.execute("SELECT radix.create_job(%s, '{\"at\": \"1970-01-01T00:00:00Z\"}', session_user, "
                          "'hostile.spawn', jsonb_build_array(jsonb_build_object('kind', 'integer', "
                          "'value', %s::text)))", (f"hostile.j{uuid.uuid4().hex}", hold_s))

    def victim_job(self) -> None:
        """The victim schedules one job, due now (later than every hostile tick)."""
        with self.as_role(self.victim) as c:
            c.execute("SELECT radix.create_job('victim.job', jsonb_build_object('at', clock_timestamp()), "
                      "session_user, 'victim.work')")

    def running(self, role: str) -> int:
        row = self.conn.execute(RUNNING_BY, (role,)).fetchone()
        return int(row[0]) if row else 0

    def victim_ran(self) -> bool:
        row = self.conn.execute("SELECT count(*) FROM victim.runs").fetchone()
        return bool(row and row[0])


@pytest.fixture
def tenants(pg: PgCluster, db: str, conn: psycopg.Connection[Any], roles: Any) -> Tenants:
    hostile, victim = roles("hostile"), roles("victim")
    for role, schema, script in ((hostile, "hostile", HOSTILE_SQL), (victim, "victim", VICTIM_SQL)):
        conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(schema),
                                                                        sql.Identifier(role)))
        with psycopg.connect(pg.dsn_for(_dbname(db), role), autocommit=True) as c:
            c.execute(script.encode())
    return Tenants(db, conn, hostile, victim, lambda role: pg.dsn_for(_dbname(db), role))


def _dbname(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


# -- the claim order, at the SQL level -----------------------------------------------------------------
def _job(conn: psycopg.Connection[Any], name: str, principal: str, due_ns: int) -> None:
    conn.execute("SELECT radix.create_job(%s, '{\"every\": \"1 hour\"}', %s, 'app.record', "
                 "'[{\"kind\": \"string\", \"value\": \"x\"}]')", (name, principal))
    conn.execute("UPDATE radix.radix_system_job_state SET due_ns = %s WHERE job_id = "
                 "(SELECT job_id FROM radix.jobs WHERE schema_name || '.' || job_name = %s)", (due_ns, name))


def _claimed(conn: psycopg.Connection[Any], node: str, limit: int, cap: int | None) -> list[str]:
    rows = conn.execute("SELECT j.principal_name, j.job_name FROM radix.claim_due(%s, %s, true, %s) c "
                        "JOIN radix.jobs j USING (job_id)", (node, limit, cap)).fetchall()
    return sorted(f"{r[0]}:{r[1]}" for r in rows)


@pytest.fixture
def three(app: App, roles: Any) -> tuple[App, str, str, str]:
    """Principals h (6 jobs due in 1970), v (1 job due now) and w (2 jobs due a second ago) of one app."""
    h, v, w = app.principal, roles("v"), roles("w")
    for role in (v, w):
        app.conn.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {0}; GRANT INSERT ON app.effects TO {0}; "
                                 "GRANT USAGE ON SEQUENCE app.effects_id_seq TO {0}").format(sql.Identifier(role)))
    row = app.conn.execute("SELECT radix.to_ns(clock_timestamp())").fetchone()
    assert row is not None
    now_ns = int(row[0])
    for i in range(6):
        _job(app.conn, f"app.h{i}", h, 1000 + i)
    _job(app.conn, "app.v0", v, now_ns)
    _job(app.conn, "app.w0", w, now_ns - 1_000_000_000)
    _job(app.conn, "app.w1", w, now_ns - 999_000_000)
    return app, h, v, w


def test_a_claim_deals_slots_round_robin_among_principals(three: tuple[App, str, str, str]) -> None:
    app, h, v, w = three
    # strict due order would give h four slots; round-robin gives each principal one, then h and w
    # (fewest running) a second each, h first (its oldest tick is older)
    assert _claimed(app.conn, "n1", 4, None) == sorted([f"{h}:h0", f"{h}:h1", f"{v}:v0", f"{w}:w0"])
    # each principal's own rows go in due order; h's next ones come after w's last
    assert _claimed(app.conn, "n1", 3, None) == sorted([f"{w}:w1", f"{h}:h2", f"{h}:h3"])


def test_a_principal_at_its_cap_gets_nothing_while_others_have_due_work(three: tuple[App, str, str, str]) -> None:
    app, h, v, w = three
    assert _claimed(app.conn, "n1", 10, 1) == sorted([f"{h}:h0", f"{v}:v0", f"{w}:w0"])
    assert _claimed(app.conn, "n1", 10, 1) == []  # every principal with due work is at its cap
    assert app.conn.execute("SELECT radix.next_due_in(1)").fetchone() == (None,)  # nothing to wake for
    uncapped = app.conn.execute("SELECT radix.next_due_in(0)").fetchone()
    assert uncapped is not None
    assert uncapped[0] <= 0
    assert _claimed(app.conn, "n1", 10, 2) == sorted([f"{h}:h1", f"{w}:w1"])
    # 0: no cap (round-robin still)
    assert _claimed(app.conn, "n1", 10, 0) == sorted(f"{h}:h{i}" for i in range(2, 6))


def test_the_cap_counts_running_attempts_of_every_node(three: tuple[App, str, str, str]) -> None:
    app, h, v, w = three
    with psycopg.connect(app.dsn, autocommit=True) as other:  # node n2 is alive: its claims are not resumed
        assert other.execute("SELECT radix.register_node('n2', 'h', 1)").fetchone() == (True,)
        assert _claimed(other, "n2", 2, 2) == sorted([f"{h}:h0", f"{w}:w0"])
        assert _claimed(app.conn, "n1", 10, 2) == sorted([f"{h}:h1", f"{v}:v0", f"{w}:w1"])
        assert _claimed(app.conn, "n1", 10, 2) == []


def test_the_default_cap_is_half_the_slots() -> None:
    assert principal_cap(8, None) == 4
    assert principal_cap(1, None) == 1
    assert principal_cap(3, None) == 1
    assert principal_cap(8, 0) == 0
    assert principal_cap(8, 6) == 6
    with pytest.raises(ValueError):
        principal_cap(8, -1)


def test_shares_are_dealt_by_fewest_running(conn: psycopg.Connection[Any]) -> None:
    def shares(running: list[int], dues: list[int], budget: int, cap: int | None) -> dict[int, int]:
        rows = conn.execute("SELECT principal::int8, share FROM radix._claim_shares(%s::oid[], %s, %s, %s, %s)",
                            ([10, 20, 30][:len(running)], running, dues, budget, cap)).fetchall()
        return {int(p): int(n) for p, n in rows}

    assert shares([0, 0, 0], [1, 2, 3], 4, None) == {10: 2, 20: 1, 30: 1}
    assert shares([3, 0, 1], [1, 2, 3], 4, None) == {20: 3, 30: 1}  # levels 1,2,2,3 → 20,20,30,20...
    assert shares([3, 0, 1], [1, 2, 3], 10, 3) == {20: 3, 30: 2}  # 10 at its cap; the rest stop at 3
    assert shares([0], [1], 0, None) == {}


# -- through the engine ----------------------------------------------------------------------------------
async def _watch(t: Tenants, cap: int, within_s: float) -> tuple[int, float]:
    """Wait (bounded) for the victim's run; returns the most hostile attempts seen running at once and the
    seconds the victim waited after its job was made."""
    most = 0
    deadline = time.monotonic() + within_s
    while t.running(t.hostile) < cap:
        assert time.monotonic() < deadline, "the hostile jobs never took their share"
        await asyncio.sleep(0.05)
    made = time.monotonic()
    t.victim_job()
    while not t.victim_ran():
        most = max(most, t.running(t.hostile))
        assert time.monotonic() < deadline, f"the victim did not run (hostile running: {most})"
        await asyncio.sleep(0.05)
    return max(most, t.running(t.hostile)), time.monotonic() - made


def test_the_victim_runs_while_the_hostile_jobs_hold_their_slots(tenants: Tenants) -> None:
    tenants.attack(jobs=12, hold_s=30)

    async def go() -> tuple[int, float, int]:
        async with Engine(tenants.db, node_id="fair", concurrency=2) as engine:  # cap: 1 of 2 slots
            task = asyncio.create_task(engine.run_for(60, poll_s=0.2))
            try:
                most, waited = await _watch(tenants, engine.max_per_principal, within_s=30)
                holding = tenants.running(tenants.hostile)
            finally:
                engine.cancel.set()
                await task
        return most, waited, holding

    most, waited, holding = asyncio.run(go())
    assert most == 1
    assert holding == 1
    assert waited < 10  # the victim did not wait for a hostile attempt to end (each holds 30 s)
    due = tenants.conn.execute("SELECT count(*) FROM radix.radix_system_job_state s JOIN radix.jobs j "
                               "USING (job_id) WHERE j.principal_name = %s AND s.due_ns < 10^12",
                               (tenants.hostile,)).fetchone()
    assert due is not None
    assert due[0] >= 10


def test_the_daemon_caps_each_principal_and_the_flag_beats_the_environment(tenants: Tenants,
                                                                           tmp_path: Path) -> None:
    tenants.attack(jobs=12, hold_s=30)
    # the environment would allow the hostile principal all 3 slots; the flag allows it 1
    daemon = Serve(tmp_path, "--per-database-concurrency", "3", "--max-per-principal", "1", "--grace", "0",
                   env={"RADIXJOBS_DSN": tenants.db, "RADIXJOBS_MAX_PER_PRINCIPAL": "3"}, name="fair")
    try:
        most, waited = asyncio.run(_watch(tenants, 1, within_s=60))
        assert most == 1
        assert tenants.running(tenants.hostile) == 1
        assert waited < 15
        wait_for(lambda: daemon.status()["running_attempts"] == 1, timeout=10,
                 message="the victim's attempt to end while the hostile one runs on")
    finally:
        daemon.stop()


def test_no_tenant_can_hold_the_claims_up(tenants: Tenants) -> None:
    """Every claim locks radix.claim_serial's row first; a tenant can neither lock it nor make a claim wait
    from an open transaction its refused statement left aborted."""
    tenants.attack(jobs=1, hold_s=0)
    with tenants.as_role(tenants.hostile) as hostile:
        hostile.autocommit = False
        for attempt in ("SELECT * FROM radix.claim_serial FOR UPDATE",
                        "LOCK TABLE radix.claim_serial IN ACCESS EXCLUSIVE MODE",
                        "SELECT * FROM radix.claim_due('evil', 10, true, 0)",
                        "SELECT radix.next_due_in(0)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                hostile.execute(attempt.encode())
            hostile.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            hostile.execute(b"SELECT * FROM radix.claim_serial FOR UPDATE")  # the transaction stays open
        tenants.conn.execute("SET lock_timeout = '5s'")
        claimed = tenants.conn.execute("SELECT count(*) FROM radix.claim_due('n1', 10, true, 1)").fetchone()
        assert claimed == (1,)
        hostile.rollback()


# -- documents: the same policy, per node ------------------------------------------------------------------
HOG_SQL = "CREATE FUNCTION hostile.hog() RETURNS void LANGUAGE sql AS $$ SELECT pg_sleep(30) $$"
VICTIM_FN_SQL = ("CREATE FUNCTION victim.task() RETURNS void LANGUAGE sql AS "
                 "$$ INSERT INTO victim.runs DEFAULT VALUES $$")
DOC_RUNNING_BY = ("SELECT count(*) FROM radix.sys_processes p JOIN radix.cron_table c ON c.num = p.task_num "
                  "WHERE p.status = 'running' AND c.principal_oid = %s::regrole")


def _document(num: int, function: str, run_as: str) -> dict[str, Any]:
    return {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
        "NUM": num, "DB_FUNCTION": function, "RUN_AS": run_as, "FIRST_RUN": "1970-01-01T00:00:00",
        "INTERVAL": "now() + interval '1 hour'"}}


def test_document_runs_are_shared_among_principals(tenants: Tenants) -> None:
    with tenants.as_role(tenants.hostile) as c:
        c.execute(HOG_SQL.encode())
        documents.apply(c, [_document(900 + i, "hostile.hog", tenants.hostile) for i in range(8)])
    with tenants.as_role(tenants.victim) as c:
        c.execute(VICTIM_FN_SQL.encode())

    def running() -> int:
        row = tenants.conn.execute(DOC_RUNNING_BY, (tenants.hostile,)).fetchone()
        return int(row[0]) if row else 0

    async def go() -> tuple[int, float]:
        stop = asyncio.Event()
        async with DocumentScheduler(tenants.db, node_id="fair:docs", concurrency=2, entry_points=False,
                                     grace_s=0.5) as scheduler:  # cap: 1 of 2 slots
            task = asyncio.create_task(scheduler.serve(stop))
            deadline = time.monotonic() + 30
            try:
                while running() < 1:
                    assert time.monotonic() < deadline, "the hostile tasks never ran"
                    await asyncio.sleep(0.05)
                with tenants.as_role(tenants.victim) as c:
                    documents.apply(c, _document(1, "victim.task", tenants.victim))
                made, most = time.monotonic(), 0
                while not tenants.victim_ran():
                    most = max(most, running())
                    assert time.monotonic() < deadline, f"the victim's task did not run (hostile: {most})"
                    await asyncio.sleep(0.05)
                return max(most, running()), time.monotonic() - made
            finally:
                stop.set()
                await task

    most, waited = asyncio.run(go())
    assert most == 1
    assert waited < 10  # not behind a hostile run (each holds 30 s)


def test_document_runs_are_dealt_round_robin() -> None:
    due = ["h1", "h2", "h3", "v1", "w1", "w2"]
    assert fair_order(due, lambda n: n[0], {}) == ["h1", "v1", "w1", "h2", "w2", "h3"]
    assert fair_order(due, lambda n: n[0], {"h": 2, "w": 1}) == ["v1", "w1", "h1", "w2", "h2", "h3"]
