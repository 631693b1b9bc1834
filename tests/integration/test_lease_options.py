"""Per-job timeouts (WITH (timeout = ...)), lease renewal, and the admission defects of issue #12 §4."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from radixjobs import catalog
from radixjobs.catalog import describe_timeout
from radixjobs.ddl import parse_job_statement
from radixjobs.engine import Engine
from radixjobs.errors import AdmissionError, ParseError
from tests.apps import App
from tests.support import wait_for

EVERY_HOUR = "SCHEDULE EVERY INTERVAL '1 hour'"
PAST = "SCHEDULE AT TIMESTAMP '2000-01-01 00:00:00+00'"


def _one(app: App, query: str, *params: Any) -> Any:
    row = app.conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


# -- timeout ---------------------------------------------------------------------------------------

def test_timeout_option_is_stored_and_shown(app: App) -> None:
    name = app.job(f"CREATE JOB app.etl {EVERY_HOUR} RUN AS {{p}} CALL app.record('x') "
                   "WITH (timeout = '2 hours') DISABLE")
    job = app.state(name)
    assert job["deadline_ms"] == 2 * 3_600_000
    assert not job["enabled"]
    assert describe_timeout(job["deadline_ms"]) == "2 hours"
    week = app.job(f"CREATE JOB app.week {EVERY_HOUR} RUN AS {{p}} CALL app.record('x') WITH (timeout = '7 days')")
    assert app.state(week)["deadline_ms"] == 604_800_000
    default = app.job(f"CREATE JOB app.plain {EVERY_HOUR} RUN AS {{p}} CALL app.record('x')")
    assert app.state(default)["deadline_ms"] == 240_000


def test_timeout_from_sql_takes_the_same_option(app: App) -> None:
    app.conn.execute("SELECT radix.create_job('app.sqljob', '{\"every\": \"1 hour\"}', %s, 'app.record', "
                     "'{\"tag\": \"x\"}', timeout => '3 hours 30 minutes')", (app.principal,))
    assert app.state("app.sqljob")["deadline_ms"] == 12_600_000


@pytest.mark.parametrize("value", ["8 days", "1 week 1 second"])
def test_timeout_above_seven_days_is_a_clear_error(app: App, value: str) -> None:
    with pytest.raises(ParseError, match="above the maximum of 7 days"):
        app.job(f"CREATE JOB app.long {EVERY_HOUR} RUN AS {{p}} CALL app.record('x') WITH (timeout = '{value}')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="above the maximum of 7 days") as sql:
        app.conn.execute("SELECT radix.create_job('app.long', '{\"every\": \"1 hour\"}', %s, 'app.record', "
                         "'{\"tag\": \"x\"}', timeout => %s::interval)", (app.principal, value))
    assert "check constraint" not in str(sql.value)
    with pytest.raises(AdmissionError, match="above the maximum of 7 days") as api:
        catalog.create_job(app.conn, parse_job_statement(
            f"CREATE JOB app.long {EVERY_HOUR} RUN AS {app.principal} CALL app.record('x')"),
            deadline_ms=604_800_001)
    assert "check constraint" not in str(api.value)
    assert _one(app, "SELECT count(*) FROM radix.jobs") == 0


def test_unknown_option_is_named_with_its_position(app: App) -> None:
    with pytest.raises(ParseError) as refused:
        app.job(f"CREATE JOB app.o {EVERY_HOUR} RUN AS {{p}} CALL app.record('x') WITH (timeout = '1 hour', "
                "retries = 3)")
    assert 'unknown option "retries"' in str(refused.value)
    assert "column" in str(refused.value)
    assert len(str(refused.value).splitlines()) == 1


def test_the_python_api_deadline_still_works(app: App) -> None:
    stmt = parse_job_statement(f"CREATE JOB app.api {EVERY_HOUR} RUN AS {app.principal} "
                                           "CALL app.record('x') WITH (timeout = '1 hour')")
    catalog.create_job(app.conn, stmt, deadline_ms=1500)
    assert app.state("app.api")["deadline_ms"] == 1500


# -- the 1-second minimum --------------------------------------------------------------------------

def test_intervals_under_one_second_are_refused(app: App) -> None:
    with pytest.raises(ParseError, match="shorter than the minimum of 1 second"):
        app.job("CREATE JOB app.fast SCHEDULE EVERY INTERVAL '1 millisecond' RUN AS {p} CALL app.record('x')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="at least 1 second"):
        app.conn.execute("SELECT radix.create_job('app.fast', '{\"every\": \"500 milliseconds\"}', %s, "
                         "'app.record', '{\"tag\": \"x\"}')", (app.principal,))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="at least 1 second"):
        app.conn.execute("SELECT radix.create_job('app.fast', '{\"every_ns\": 999999999}', %s, "
                         "'app.record', '{\"tag\": \"x\"}')", (app.principal,))
    app.job("CREATE JOB app.ok SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('x')")


# -- the state machine -----------------------------------------------------------------------------

def test_disable_during_an_attempt_then_enable_runs_again(app: App) -> None:
    """The attempt's history row is closed by the re-arm; the next claim of the same tick does not collide."""
    name = app.job(f"CREATE JOB app.once {PAST} RUN AS {{p}} CALL app.record('once')")
    claimed = app.conn.execute("SELECT job_id FROM radix.claim_due('ghost', 10)").fetchall()
    assert len(claimed) == 1
    catalog.alter_job(app.conn, name, enabled=False)
    catalog.alter_job(app.conn, name, enabled=True)
    other = app.job(f"CREATE JOB app.other {PAST} RUN AS {{p}} CALL app.record('other')")
    app.run()
    assert sorted(e[1] for e in app.effects()) == ["once", "other"]
    assert [h["status"] for h in app.history(name)] == ["lease_lost", "succeeded"]
    assert app.state(other)["status"] == "complete"


def test_a_claim_heals_a_database_wedged_before_the_fix(app: App) -> None:
    """A history row left 'running' by the old re-arm (written here by hand) no longer blocks claims."""
    name = app.job(f"CREATE JOB app.w {PAST} RUN AS {{p}} CALL app.record('w')")
    app.conn.execute("INSERT INTO radix.radix_system_job_history (job_id, definition_version, planned_ns, "
                     "attempt, idempotency_key, status) SELECT job_id, 1, at_ns, 1, 'k', 'running' "
                     "FROM radix.jobs")
    app.run()
    assert [e[1] for e in app.effects()] == ["w"]
    assert [h["status"] for h in app.history(name)] == ["lease_lost", "succeeded"]


def test_a_completed_one_time_job_stays_complete_through_disable_enable(app: App) -> None:
    name = app.job(f"CREATE JOB app.one {PAST} RUN AS {{p}} CALL app.record('one')")
    app.run()
    assert app.state(name)["status"] == "complete"
    assert app.state(name)["next_run_at"] is None
    catalog.alter_job(app.conn, name, enabled=False)
    catalog.alter_job(app.conn, name, enabled=True)
    state = app.state(name)
    assert (state["status"], state["next_run_at"], state["due_ns"]) == ("complete", None, None)
    app.run()
    assert [e[1] for e in app.effects()] == ["one"]
    assert len(app.history(name)) == 1


def test_a_disabled_job_has_no_next_run(app: App) -> None:
    name = app.job(f"CREATE JOB app.off {EVERY_HOUR} RUN AS {{p}} CALL app.record('x') DISABLE")
    assert app.state(name)["next_run_at"] is None
    catalog.alter_job(app.conn, name, enabled=True)
    assert app.state(name)["next_run_at"] is not None


def test_drop_job_after_its_node_died_is_not_refused(app: App) -> None:
    name = app.job(f"CREATE JOB app.d {PAST} RUN AS {{p}} CALL app.record('x')")
    app.conn.execute("SELECT * FROM radix.claim_due('dead-node', 10)")  # a claim whose node never lived
    assert catalog.drop_job(app.conn, name)


def test_drop_job_while_a_live_node_holds_the_claim_is_refused(app: App) -> None:
    name = app.job(f"CREATE JOB app.d {PAST} RUN AS {{p}} CALL app.record('x')")
    with psycopg.connect(app.dsn, autocommit=True) as control:
        control.execute("SELECT radix.register_node('live-node', 'h', 1)")
        control.execute("SELECT * FROM radix.claim_due('live-node', 10)")
        with pytest.raises(AdmissionError, match="an attempt is running"):
            catalog.drop_job(app.conn, name)
    wait_for(lambda: not _one(app, "SELECT radix.node_alive('live-node')"), message="the node to die")
    assert catalog.drop_job(app.conn, name)  # the control session ended: the node is dead


# -- frozen defaults ---------------------------------------------------------------------------------

def test_defaults_are_frozen_at_create(app: App) -> None:
    app.conn.execute("CREATE PROCEDURE app.d(tag text DEFAULT 'first') LANGUAGE sql "
                     "AS $$ CALL app.record(tag) $$")
    name = app.job(f"CREATE JOB app.d {PAST} RUN AS {{p}} CALL app.d()")
    assert [(a["name"], a["value"]) for a in app.state(name)["arguments"]] == [("tag", "first")]
    app.conn.execute("CREATE OR REPLACE PROCEDURE app.d(tag text DEFAULT 'second') LANGUAGE sql "
                     "AS $$ CALL app.record(tag) $$")
    app.run()
    assert [e[1] for e in app.effects()] == ["first"]


def test_defaults_by_position_by_name_and_volatile(app: App) -> None:
    app.conn.execute("CREATE PROCEDURE app.p(text, n integer DEFAULT 2 + 3, at timestamptz DEFAULT now()) "
                     "LANGUAGE sql AS $$ CALL app.record($1 || n) $$")
    before = _one(app, "SELECT now()")
    name = app.job(f"CREATE JOB app.p {PAST} RUN AS {{p}} CALL app.p('x')")
    args = {a["position"]: a for a in app.state(name)["arguments"]}
    assert args[2]["value"] == "5"
    assert not args[2]["by_name"]
    assert args[3]["type"] == "timestamp with time zone"  # now() frozen: the creation time
    assert _one(app, "SELECT %s::timestamptz >= %s", args[3]["value"], before)
    app.run()
    assert [e[1] for e in app.effects()] == ["x5"]


def test_an_unnamed_default_after_a_named_argument_is_refused(app: App) -> None:
    app.conn.execute("CREATE PROCEDURE app.u(a text, text DEFAULT 'x') LANGUAGE sql AS $$ SELECT 1 $$")
    with pytest.raises(AdmissionError, match="cannot freeze the default of unnamed parameter 2"):
        app.job(f"CREATE JOB app.u {EVERY_HOUR} RUN AS {{p}} CALL app.u(a => 'y')")
    app.job(f"CREATE JOB app.u {EVERY_HOUR} RUN AS {{p}} CALL app.u('y')")


# -- leases ----------------------------------------------------------------------------------------

def test_claims_take_the_lease_length_and_renewal_is_fenced(app: App) -> None:
    app.job(f"CREATE JOB app.l {PAST} RUN AS {{p}} CALL app.record('x')")
    with psycopg.connect(app.dsn, autocommit=True) as control:
        control.execute("SELECT radix.register_node('n1', 'h', 1)")
        token = _one(app, "SELECT lease_token FROM radix.claim_due('n1', 10, true, NULL, 7)")
        # the lease runs 7 s from the claim (its updated_at), whenever this reads it
        lease = _one(app, "SELECT extract(epoch FROM lease_expires_at - updated_at) FROM radix.radix_system_job_state")
        assert lease == 7
        renewing = _one(app, "SELECT clock_timestamp()")
        renewed = app.conn.execute("SELECT radix.renew_leases('n1', ARRAY[%s, gen_random_uuid()], 600)",
                                   (token,)).fetchall()
        assert renewed == [(token,)]
        # 600 s from the renewal: no sooner than from just before it, and no later than from now
        after, left = app.conn.execute("SELECT extract(epoch FROM lease_expires_at - %s::timestamptz), "
                                       "extract(epoch FROM lease_expires_at - clock_timestamp()) "
                                       "FROM radix.radix_system_job_state", (renewing,)).fetchone() or (0, 0)
        assert after >= 600
        assert left <= 600
        assert app.conn.execute("SELECT radix.renew_leases('n2', ARRAY[%s], 600)", (token,)).fetchall() == []
    # the node's control session is gone (its backend exits asynchronously): nothing is renewed
    wait_for(lambda: app.conn.execute("SELECT radix.renew_leases('n1', ARRAY[%s], 600)", (token,)).fetchall() == [],
             message="the dead node's renewal to return nothing")


def test_a_lost_lease_ends_the_attempt_at_once(app: App) -> None:
    """ALTER JOB DISABLE under a running attempt: the next renewal finds the lease gone and ends it,
    instead of letting it run to its timeout."""
    app.conn.execute("CREATE PROCEDURE app.sleepy() LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(600); END $$")
    name = app.job(f"CREATE JOB app.sleepy {PAST} RUN AS {{p}} CALL app.sleepy() WITH (timeout = '10 minutes')")

    async def go() -> Engine:
        async with Engine(app.dsn, node_id="keeper", lease_s=3) as engine:
            await engine.dispatch_due()
            await asyncio.to_thread(wait_for, lambda: _one(app, "SELECT count(*) FROM pg_stat_activity WHERE "
                                                                "query LIKE '%%CALL%%sleepy%%' AND state = 'active' "
                                                                "AND wait_event = 'PgSleep'"),
                                    message="the attempt to run")
            await asyncio.to_thread(catalog.alter_job, app.conn, name, enabled=False)
            # ended within 120 s, however loaded the machine: long before its 600 s sleep or 10-minute timeout
            await asyncio.wait_for(asyncio.gather(*engine.inflight.tasks), 120)
            return engine

    engine = asyncio.run(go())
    assert engine.counters["terminations"] >= 1
    assert app.state(name)["status"] == "disabled"
    assert [h["status"] for h in app.history(name)] == ["lease_lost"]


def test_a_running_attempt_keeps_its_lease_past_several_periods(app: App) -> None:
    # a 6 s lease renewed every 2 s: a renewal may come up to 4 s late on a loaded machine
    app.conn.execute("CREATE PROCEDURE app.nap() LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(14); "
                     "CALL app.record('nap'); END $$")
    name = app.job(f"CREATE JOB app.nap {PAST} RUN AS {{p}} CALL app.nap()")
    expiries: list[Any] = []

    def expiry() -> Any:
        row = app.conn.execute("SELECT lease_expires_at > clock_timestamp(), lease_expires_at "
                               "FROM radix.job_overview WHERE status = 'running'").fetchone()
        return row or (None, None)

    async def go() -> Engine:
        async with Engine(app.dsn, node_id="keeper", lease_s=6) as engine:
            await engine.dispatch_due()
            while engine.inflight.tasks:
                expiries.append(await asyncio.to_thread(expiry))  # off the engine's loop: its renewals run on
                await asyncio.sleep(0.5)
        return engine

    engine = asyncio.run(go())
    assert engine.counters["successes"] == 1
    assert all(live in (True, None) for live, _ in expiries)
    assert len({at for _, at in expiries if at is not None}) >= 3  # renewed past several periods
    assert [h["status"] for h in app.history(name)] == ["succeeded"]
    assert [e[1] for e in app.effects()] == ["nap"]
