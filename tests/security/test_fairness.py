"""Starvation: one principal's past-due work must not take every slot (docs/security.md "Fair claims").

The attack (red team, item 4): claims went strictly by oldest due time and a job may be due in 1970, so a
tenant whose jobs are due in 1970, sleep, and each schedule more of themselves held every slot, and the
victim's job never ran. Now a claim deals slots round-robin among principals with due work (fewest running
first, then oldest due tick) and a principal with ``max_per_principal`` attempts running in the database
(every node counted) gets no more.

A second attack (red team): a tenant owned jobs RUN AS itself and as a second principal it may SET ROLE to,
each WITH (timeout = '7 days') and trapping every cancel, and held every slot for as long as they ran. Now
long attempts (a timeout above --long-attempt) never hold an engine's reserved slots, and a free slot goes to
the principal with the fewest running, then the one this node served least recently.

Every hostile job here is created by the hostile role itself (radix.create_job, or CREATE JOB as each owner),
as in the attacks. Waits are on conditions, bounded.
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

from radixjobs import catalog, documents
from radixjobs.documents import Documents
from radixjobs.engine import Engine
from radixjobs.fairness import LONG_ATTEMPT_S, Reserve, fair_order, principal_cap, reserved_slots
from tests.acceptance.conftest import run_cli
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
def _job(conn: psycopg.Connection[Any], name: str, principal: str, due_ns: int, timeout: str | None = None) -> None:
    conn.execute("SELECT radix.create_job(%s, '{\"every\": \"1 hour\"}', %s, 'app.record', "
                 "'[{\"kind\": \"string\", \"value\": \"x\"}]', timeout => %s::interval)",
                 (name, principal, timeout))
    conn.execute("UPDATE radix.radix_system_job_state SET due_ns = %s WHERE job_id = "
                 "(SELECT job_id FROM radix.jobs WHERE schema_name || '.' || job_name = %s)", (due_ns, name))


def _claimed(conn: psycopg.Connection[Any], node: str, limit: int, cap: int | None, long_ms: int | None = None,
             max_long: int | None = None, served: list[int] | None = None) -> list[str]:
    rows = conn.execute("SELECT j.principal_name, j.job_name FROM radix.claim_due(%s, %s, true, %s, 300, false, "
                        "%s, %s, %s::oid[]) c JOIN radix.jobs j USING (job_id)",
                        (node, limit, cap, long_ms, max_long, served)).fetchall()
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
async def _watch(t: Tenants, cap: int, within_s: float) -> int:
    """Wait (bounded) for the victim's run; returns the most hostile attempts seen running at once."""
    most = 0
    deadline = time.monotonic() + within_s
    while t.running(t.hostile) < cap:
        assert time.monotonic() < deadline, "the hostile jobs never took their share"
        await asyncio.sleep(0.05)
    t.victim_job()
    while not t.victim_ran():
        most = max(most, t.running(t.hostile))
        assert time.monotonic() < deadline, f"the victim did not run (hostile running: {most})"
        await asyncio.sleep(0.05)
    return max(most, t.running(t.hostile))


def test_the_victim_runs_while_the_hostile_jobs_hold_their_slots(tenants: Tenants) -> None:
    # each hostile attempt holds its slot until its job's timeout (4 minutes): a victim that waited for one to
    # end would not run within _watch's 120 s
    tenants.attack(jobs=12, hold_s=600)

    async def go() -> tuple[int, int]:
        async with Engine(tenants.db, node_id="fair", concurrency=2) as engine:  # cap: 1 of 2 slots
            task = asyncio.create_task(engine.run_for(600, poll_s=0.2))
            try:
                most = await _watch(tenants, engine.max_per_principal, within_s=120)
                holding = tenants.running(tenants.hostile)
            finally:
                engine.cancel.set()
                await task
        return most, holding

    most, holding = asyncio.run(go())
    assert most == 1
    assert holding == 1  # the victim ran while the hostile attempt held its slot
    due = tenants.conn.execute("SELECT count(*) FROM radix.radix_system_job_state s JOIN radix.jobs j "
                               "USING (job_id) WHERE j.principal_name = %s AND s.due_ns < 10^12",
                               (tenants.hostile,)).fetchone()
    assert due is not None
    assert due[0] >= 10


def test_the_daemon_caps_each_principal_and_the_flag_beats_the_environment(tenants: Tenants,
                                                                           tmp_path: Path) -> None:
    tenants.attack(jobs=12, hold_s=600)  # each holds its slot until its job's timeout (4 minutes)
    # the environment would allow the hostile principal all 3 slots; the flag allows it 1
    daemon = Serve(tmp_path, "--per-database-concurrency", "3", "--max-per-principal", "1", "--grace", "0",
                   env={"RADIXJOBS_DSN": tenants.db, "RADIXJOBS_MAX_PER_PRINCIPAL": "3"}, name="fair")
    try:
        most = asyncio.run(_watch(tenants, 1, within_s=120))
        assert most == 1
        assert tenants.running(tenants.hostile) == 1
        wait_for(lambda: daemon.status()["running_attempts"] == 1, timeout=60,
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
HOG_SQL = "CREATE FUNCTION hostile.hog() RETURNS void LANGUAGE sql AS $$ SELECT pg_sleep(600) $$"
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

    async def go() -> int:
        async with Engine(tenants.db, node_id="fair", concurrency=2, grace_s=0.5,
                          work=Documents(entry_points=False), jobs=False) as scheduler:  # cap: 1 of 2 slots
            task = asyncio.create_task(scheduler.run_for(600))
            # each hostile run holds its slot 600 s (its db timeout: 4 minutes): a victim's task that waited for
            # one to end would not run within 120 s
            deadline = time.monotonic() + 120
            try:
                while running() < 1:
                    assert time.monotonic() < deadline, "the hostile tasks never ran"
                    await asyncio.sleep(0.05)
                with tenants.as_role(tenants.victim) as c:
                    documents.apply(c, _document(1, "victim.task", tenants.victim))
                most = 0
                while not tenants.victim_ran():
                    most = max(most, running())
                    assert time.monotonic() < deadline, f"the victim's task did not run (hostile: {most})"
                    await asyncio.sleep(0.05)
                return max(most, running())
            finally:
                scheduler.cancel.set()
                await task

    assert asyncio.run(go()) == 1  # one hostile run at a time, and the victim's task not behind it


def test_document_runs_are_dealt_round_robin() -> None:
    due = ["h1", "h2", "h3", "v1", "w1", "w2"]
    assert fair_order(due, lambda n: n[0], {}) == ["h1", "v1", "w1", "h2", "w2", "h3"]
    assert fair_order(due, lambda n: n[0], {"h": 2, "w": 1}) == ["v1", "w1", "h1", "w2", "h2", "h3"]


# -- long attempts: the reserved slots -------------------------------------------------------------------
# The attack (red team): a tenant owns 4 jobs RUN AS itself and 4 RUN AS a second principal it may SET ROLE
# to, each WITH (timeout = '7 days'), whose procedure traps every cancel. With 4 slots per database (a cap of
# 2 per principal) they held all 4 for as long as they ran, and the victim, another owner, ran 0 times.
# Now long attempts (a timeout above --long-attempt) hold at most the slots less the reserved ones.

# Holds its slot until the test inserts into hostile.stop, catching every cancel (statement_timeout and the
# engine's own): only the engine's termination past the job's timeout (+ grace) would end it sooner.
HOLD_SQL = """
CREATE TABLE hostile.stop (at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE PROCEDURE hostile.hold() LANGUAGE plpgsql AS $$
BEGIN
    WHILE NOT EXISTS (SELECT 1 FROM hostile.stop) LOOP
        BEGIN
            PERFORM pg_sleep(0.1);
        EXCEPTION WHEN query_canceled THEN
            NULL;
        END;
    END LOOP;
END $$;
"""
RUNNING_OF = ("SELECT count(*) FROM radix.radix_system_job_state s JOIN radix.jobs j USING (job_id) "
              "WHERE s.status = 'running' AND j.principal_name = ANY (%s) AND j.deadline_ms > %s")
ATTEMPTS_OF = ("SELECT count(*) FROM radix.radix_system_job_history h JOIN radix.jobs j USING (job_id) "
               "WHERE j.principal_name = %s")


@dataclass
class Landlord:
    """A tenant with a second principal it may SET ROLE to (and a spare one), and a victim owner."""

    tenants: Tenants
    second: str
    spare: str

    def hold(self, owner: str, principal: str, jobs: int, timeout: str) -> None:
        """``owner`` (the tenant, or a role it sets) creates ``jobs`` jobs due in 1970 RUN AS ``principal``
        that hold their slots, through CREATE JOB."""
        with self.tenants.as_role(self.tenants.hostile) as c:
            if owner != self.tenants.hostile:
                c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
            for _ in range(jobs):
                catalog.execute_job_ddl(c, f"CREATE JOB hostile.h{uuid.uuid4().hex[:12]} SCHEDULE AT TIMESTAMP "
                                           f"'1970-01-01 00:00:00+00' RUN AS {principal} CALL hostile.hold() "
                                           f"WITH (timeout = '{timeout}')")

    def victim_every_second(self, timeout: str = "4 minutes") -> None:
        with self.tenants.as_role(self.tenants.victim) as c:
            catalog.execute_job_ddl(c, f"CREATE JOB victim.tick SCHEDULE EVERY INTERVAL '1 second' "
                                       f"RUN AS {self.tenants.victim} CALL victim.work() WITH (timeout = '{timeout}')")

    def long_running(self, long_ms: int = 300_000) -> int:
        row = self.tenants.conn.execute(RUNNING_OF, ([self.tenants.hostile, self.second], long_ms)).fetchone()
        return int(row[0]) if row else 0

    def attempts(self, principal: str) -> int:
        row = self.tenants.conn.execute(ATTEMPTS_OF, (principal,)).fetchone()
        return int(row[0]) if row else 0

    def victim_runs(self) -> int:
        row = self.tenants.conn.execute("SELECT count(*) FROM victim.runs").fetchone()
        return int(row[0]) if row else 0

    def stop(self) -> None:
        self.tenants.conn.execute("INSERT INTO hostile.stop DEFAULT VALUES")


@pytest.fixture
def landlord(tenants: Tenants, roles: Any) -> Landlord:
    second, spare = roles("second"), roles("spare")
    with tenants.as_role(tenants.hostile) as c:
        c.execute(HOLD_SQL.encode())
    for role in (second, spare):  # principals the tenant may SET ROLE to (and so create jobs as)
        tenants.conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(tenants.hostile)))
        with tenants.as_role(tenants.hostile) as c:
            c.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA hostile TO {0}; GRANT SELECT ON hostile.stop TO {0}")
                      .format(sql.Identifier(role)))
    return Landlord(tenants, second, spare)


async def _until(condition: Callable[[], bool], within_s: float, message: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, message
        await asyncio.sleep(0.05)


def test_long_attempts_leave_the_reserved_slot_to_the_victims_schedule(landlord: Landlord) -> None:
    t = landlord.tenants
    landlord.hold(t.hostile, t.hostile, 4, "7 days")
    landlord.hold(landlord.second, landlord.second, 4, "7 days")  # owned by the second principal as well

    async def go() -> tuple[int, int]:
        # 4 slots, 2 per principal, 1 reserved: the long attempts hold 3. A 60 s poll: 5 runs of the victim's
        # every-second job within 120 s are the engine's timer's (about 4 s), not the poll's (4 polls apart).
        async with Engine(t.db, node_id="reserve", concurrency=4, grace_s=0.5) as engine:
            assert (engine.max_per_principal, engine.reserve.long_cap) == (2, 3)
            task = asyncio.create_task(engine.run_for(600, poll_s=60.0))
            try:
                await _until(lambda: landlord.long_running() == 3, 60, "the long attempts to take their slots")
                landlord.victim_every_second()
                made, most = time.monotonic(), 3
                while landlord.victim_runs() < 5:
                    most = max(most, landlord.long_running())
                    assert time.monotonic() - made < 120, f"the victim ran {landlord.victim_runs()} times"
                    await asyncio.sleep(0.05)
                return most, landlord.long_running()
            finally:
                landlord.stop()
                engine.cancel.set()
                await task

    most, holding = asyncio.run(go())
    assert most == 3  # never the reserved slot
    assert holding == 3  # the victim ran while every long attempt held its slot (each holds 7 days)


def test_a_spare_principal_does_not_win_every_turn_of_the_reserved_slot(landlord: Landlord) -> None:
    """The reserved slot turns over, and a free slot goes to the principal with the fewest running, then to
    the one served least recently: the tenant's spare principal, whose short attempts (ended by the engine 1
    s + grace after they start) are due in 1970, takes every other turn, not every one."""
    t = landlord.tenants
    landlord.hold(t.hostile, t.hostile, 4, "7 days")
    landlord.hold(t.hostile, landlord.second, 4, "7 days")
    landlord.hold(t.hostile, landlord.spare, 8, "1 second")

    async def go() -> tuple[int, int]:
        async with Engine(t.db, node_id="turns", concurrency=4, grace_s=0.5) as engine:
            task = asyncio.create_task(engine.run_for(600, poll_s=0.5))
            try:
                await _until(lambda: landlord.long_running() == 3, 60, "the long attempts to take their slots")
                await _until(lambda: landlord.attempts(landlord.spare) >= 1, 60, "the spare principal's turn")
                landlord.victim_every_second()
                await _until(lambda: landlord.victim_runs() >= 3, 90,
                             f"the victim's turns (the spare's attempts: {landlord.attempts(landlord.spare)})")
                return landlord.attempts(landlord.spare), landlord.long_running()
            finally:
                landlord.stop()
                engine.cancel.set()
                await task

    spare, holding = asyncio.run(go())
    assert spare >= 2  # it kept competing for the reserved slot
    assert holding == 3


def test_the_daemon_keeps_the_reserve_and_its_flag_beats_the_environment(landlord: Landlord, tmp_path: Path) -> None:
    """RADIXJOBS_LONG_ATTEMPT=120 makes attempts with the default timeout of 4 minutes long (the victim's is 1
    minute); --reserved-slots 1 beats the environment's 0. No cap per principal: the reserve alone holds."""
    t = landlord.tenants
    landlord.hold(t.hostile, t.hostile, 4, "4 minutes")
    # a 60 s poll: 5 runs of the victim's every-second job within 120 s are the timer's, not the poll's
    daemon = Serve(tmp_path, "--per-database-concurrency", "3", "--max-per-principal", "0", "--reserved-slots", "1",
                   "--poll", "60", "--grace", "0",
                   env={"RADIXJOBS_DSN": t.db, "RADIXJOBS_RESERVED_SLOTS": "0", "RADIXJOBS_LONG_ATTEMPT": "120"},
                   name="reserve")
    try:
        wait_for(lambda: landlord.long_running(120_000) == 2, timeout=60, message="the long attempts to hold 2 slots")
        landlord.victim_every_second("1 minute")
        made, most = time.monotonic(), 2
        while landlord.victim_runs() < 5:
            most = max(most, landlord.long_running(120_000))
            assert time.monotonic() - made < 120, f"the victim ran {landlord.victim_runs()} times"
            time.sleep(0.05)
        assert most == 2
        assert landlord.long_running(120_000) == 2
    finally:
        daemon.stop()
        landlord.stop()


def test_a_claim_takes_no_more_long_attempts_than_it_may(app: App, roles: Any) -> None:
    """radix.claim_due with long_ms and max_long: once max_long long ticks are taken, each principal's scan
    passes its long ticks by and takes its short ones; radix.next_due_in with long_ms leaves long ticks out."""
    h, v = app.principal, roles("v")
    app.conn.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {0}; GRANT INSERT ON app.effects TO {0}; "
                             "GRANT USAGE ON SEQUENCE app.effects_id_seq TO {0}").format(sql.Identifier(v)))
    for i in range(3):
        _job(app.conn, f"app.long{i}", h, 1000 + 2 * i, timeout="1 hour")
        _job(app.conn, f"app.short{i}", h, 1001 + 2 * i)
    assert _claimed(app.conn, "n1", 10, None, 300_000, 1) == sorted(
        [f"{h}:long0", f"{h}:short0", f"{h}:short1", f"{h}:short2"])
    row = app.conn.execute("SELECT radix.next_due_in(0, 300000), radix.next_due_in(0)").fetchone()
    assert row is not None
    assert row[0] > 200  # only long ticks are due (the claimed short ones again when their leases end)
    assert row[1] <= 0
    assert _claimed(app.conn, "n1", 10, None, 300_000, 0) == []
    # two principals' scans take 3 long ones where 2 are left: the one kept is h's first, v's only
    _job(app.conn, "app.vlong", v, 1000, timeout="1 hour")
    assert _claimed(app.conn, "n1", 10, None, 300_000, 2) == sorted([f"{h}:long1", f"{v}:vlong"])
    assert _claimed(app.conn, "n1", 10, None) == [f"{h}:long2"]  # NULL: no limit


def test_ties_go_to_the_principal_served_least_recently(three: tuple[App, str, str, str]) -> None:
    app, h, v, w = three
    oid = {r: int(app.conn.execute("SELECT %s::regrole::oid", (r,)).fetchone()[0])  # type: ignore[index]
           for r in (h, v, w)}
    # every principal has 0 running: h (due in 1970) would win the tie; h and w were served more recently
    assert _claimed(app.conn, "n1", 1, None, served=[oid[w], oid[h]]) == [f"{v}:v0"]
    assert _claimed(app.conn, "n1", 1, None, served=[oid[v], oid[h]]) == [f"{w}:w0"]  # v now has 1 running


def test_a_find_deals_what_it_cannot_share_evenly_to_the_principal_served_least_recently(
        three: tuple[App, str, str, str]) -> None:
    """radix.find_ticks breaks ties as radix.claim_due does: a find of fewer ticks than the principals with
    due ticks gives them to those this node served least recently, so under a backlog no principal gets the
    odd ones at every find (by its oid or its due time)."""
    app, h, v, w = three
    oid = {r: int(app.conn.execute("SELECT %s::regrole::oid", (r,)).fetchone()[0])  # type: ignore[index]
           for r in (h, v, w)}
    app.conn.execute("UPDATE radix.radix_system_job_state SET due_ns = 0")  # all due alike: no tie broken by due

    def found(served: list[int] | None) -> set[str]:
        rows = app.conn.execute("SELECT p.rolname FROM radix.find_ticks('n1', 1, 0, '{}', '{}', %s::oid[]) f "
                                "JOIN pg_roles p ON p.oid = f.principal", (served,)).fetchall()
        return {r[0] for r in rows}

    assert found([oid[h], oid[v]]) == {w}  # never served first
    assert found([oid[w], oid[h], oid[v]]) == {w}  # then the least recently served
    assert found([oid[v], oid[w], oid[h]]) == {v}


@pytest.mark.usefixtures("batchable")  # batches form whatever the machine's load
def test_a_batch_never_mixes_long_and_short_ticks(app: App) -> None:
    """A tick batch holds its lead's slot, and its ticks not run in it then run alone there: its ticks are
    all long or all short. The ticks of one batch share their start in the history."""
    for i in range(24):
        app.job(f"CREATE JOB app.b{i} SCHEDULE AT TIMESTAMP '1970-01-01 00:00:00+00' RUN AS {{p}} "
                f"CALL app.record('b') WITH (timeout = '{'1 hour' if i % 2 else '1 minute'}', batch = on)")
    app.run(concurrency=2)
    rows = app.conn.execute(
        "SELECT h.started_at, bool_and(j.deadline_ms > 300000), bool_or(j.deadline_ms > 300000), count(*) "
        "FROM radix.radix_system_job_history h JOIN radix.jobs j USING (job_id) GROUP BY h.started_at").fetchall()
    assert sum(r[3] for r in rows) == 24
    assert any(r[3] > 1 for r in rows), "no batch formed"
    assert all(r[1] == r[2] for r in rows), rows


def test_the_reserve_defaults_to_a_quarter_of_the_slots() -> None:
    assert [reserved_slots(n, None) for n in (1, 2, 3, 4, 8, 16)] == [0, 1, 1, 1, 2, 4]
    assert reserved_slots(16, 0) == 0
    assert reserved_slots(16, 16) == 16  # no long attempt runs there
    with pytest.raises(ValueError, match="17 reserved slots"):
        reserved_slots(16, 17)
    with pytest.raises(ValueError):
        reserved_slots(16, -1)
    reserve = Reserve.of(16, None, LONG_ATTEMPT_S)
    assert (reserve.long_ms, reserve.long_cap) == (300_000, 12)
    assert not reserve.is_long(240_000)  # the default job timeout
    assert reserve.is_long(300_001)
    assert reserve.long_free(12) == 0
    with pytest.raises(ValueError):
        Reserve.of(16, None, 0)


def test_reserving_more_slots_than_there_are_is_one_clear_line(app: App) -> None:
    result = run_cli("run", "--once", "--dsn", app.dsn, "--concurrency", "8", "--reserved-slots", "9")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--reserved-slots" in result.stderr
    assert "9 is more than the 8 slots of --concurrency" in result.stderr
    result = run_cli("run", "--once", "--dsn", app.dsn, env={"RADIXJOBS_LONG_ATTEMPT": "0"})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--long-attempt" in result.stderr
