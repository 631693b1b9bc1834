"""The engine against a real PostgreSQL: ticks, frames, exactly-once, retries, fencing."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import psycopg
import pytest

from radixjobs import catalog, schedule
from radixjobs.db import aconnect
from radixjobs.engine.planning import CronPlanner
from tests.apps import App
from tests.support import wait_for

FIVE_MIN_NS = 300 * 10**9


def test_one_time_job_runs_once_as_its_principal(app: App) -> None:
    name = app.job("CREATE JOB app.once SCHEDULE AT TIMESTAMP '2020-01-01T00:00:00Z' "
                   "RUN AS {p} CALL app.record('x')")
    engine = app.run()
    assert engine.counters["successes"] == 1
    (effect,) = app.effects()
    state = app.state(name)
    assert effect[2:4] == (app.principal, app.principal)  # current_user, session_user
    assert effect[4] == state["job_id"]
    assert effect[5] == 1
    assert effect[6] == f"{state['job_id']}/1577836800000000000"
    assert effect[7].isoformat() == "2020-01-01T00:00:00+00:00"
    assert state["status"] == "complete"
    assert [h["status"] for h in app.history(name)] == ["succeeded"]
    assert app.run().counters["claims"] == 0  # nothing left to do


def test_frame_is_null_outside_an_attempt(app: App) -> None:
    row = app.conn.execute("SELECT radix.current_job_id(), radix.current_job_attempt(), "
                           "radix.current_job_scheduled_at(), radix.current_idempotency_key()").fetchone()
    assert row == (None, None, None, None)


def test_interval_job_moves_to_next_grid_tick(app: App) -> None:
    name = app.job("CREATE JOB app.every SCHEDULE EVERY INTERVAL '5 minutes' RUN AS {p} CALL app.record('e')")
    planned = app.state(name)["planned_ns"]
    app.make_due(name)
    app.run()
    state = app.state(name)
    assert state["status"] == "scheduled"
    assert state["planned_ns"] == planned + FIVE_MIN_NS
    assert state["attempt"] == 0
    assert len(app.effects()) == 1


def test_missed_ticks_coalesce_to_the_latest(app: App) -> None:
    name = app.job("CREATE JOB app.every SCHEDULE EVERY INTERVAL '5 minutes' RUN AS {p} CALL app.record('c')")
    # pretend the scheduler was down for two hours: the planned tick is 24 grid steps and a bit ago
    app.conn.execute(
        "UPDATE radix.radix_system_job_state SET planned_ns = t, anchor_ns = t, due_ns = t "
        "FROM (SELECT radix.to_ns(clock_timestamp()) - %s AS t) AS past", (24 * FIVE_MIN_NS + 10**9,))
    before = app.state(name)["planned_ns"]
    engine = app.run()
    assert engine.counters["coalesced_ticks"] == 24
    assert len(app.effects()) == 1
    history = app.history(name)
    assert history[0]["planned_ns"] == before + 24 * FIVE_MIN_NS
    state = app.state(name)
    assert state["coalesced_ticks"] == 24
    assert state["planned_ns"] == before + 25 * FIVE_MIN_NS


def test_conflicts_retry_with_the_same_key_then_fail(app: App) -> None:
    app.conn.execute("CREATE PROCEDURE app.conflict() LANGUAGE plpgsql AS $$ BEGIN "
                     "INSERT INTO app.effects(tag) VALUES ('rolled back'); "
                     "RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")
    app.conn.execute(f"GRANT EXECUTE ON PROCEDURE app.conflict() TO {app.principal}")
    name = app.job("CREATE JOB app.c SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.conflict()")
    for _ in range(5):
        app.make_due(name)
        app.run()
    history = app.history(name)
    assert [h["attempt"] for h in history] == [1, 2, 3, 4, 5]
    assert [h["status"] for h in history] == ["retrying"] * 4 + ["failed"]
    assert len({h["idempotency_key"] for h in history}) == 1
    assert all(h["error"]["category"] == "conflict" and h["error"]["detail"]["scheduler_retryable"]
               for h in history)
    assert app.state(name)["status"] == "failed"
    assert app.effects() == []  # every failed attempt's effects rolled back


def test_terminal_failure_moves_an_interval_job_on(app: App) -> None:
    app.conn.execute("CREATE PROCEDURE app.boom() LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'boom'; END $$")
    name = app.job("CREATE JOB app.b SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.boom()")
    planned = app.state(name)["planned_ns"]
    app.make_due(name)
    app.run()
    state = app.state(name)
    assert state["status"] == "scheduled"
    assert state["planned_ns"] == planned + 3600 * 10**9
    (h,) = app.history(name)
    assert h["status"] == "failed"
    assert h["error"]["error"] == "PL_JOB_ATTEMPT_FAILED"
    assert h["error"]["kind"] == "raise_exception"
    assert h["error"]["message"] == "boom"
    assert h["error"]["idempotency_key"] == h["idempotency_key"]


def test_procedure_that_commits_runs_non_atomically_and_is_flagged(app: App) -> None:
    app.conn.execute("""CREATE PROCEDURE app.commits() LANGUAGE plpgsql AS $$
        BEGIN
          IF radix.once() THEN
            INSERT INTO app.effects(tag, key) VALUES ('once', radix.current_idempotency_key());
          END IF;
          COMMIT;
          INSERT INTO app.effects(tag) VALUES ('after commit');
        END $$""")
    name = app.job("CREATE JOB app.nc SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.commits()")
    app.run()
    state = app.state(name)
    assert state["non_atomic"] is True
    assert state["status"] == "complete"
    assert [e[1] for e in app.effects()] == ["once", "after commit"]
    (h,) = app.history(name)
    assert h["status"] == "succeeded"
    assert h["atomic"] is False


def test_once_deduplicates_a_resumed_tick(app: App) -> None:
    app.conn.execute("""CREATE PROCEDURE app.commits() LANGUAGE plpgsql AS $$
        BEGIN
          IF radix.once() THEN INSERT INTO app.effects(tag) VALUES ('effect'); END IF;
          COMMIT;
        END $$""")
    name = app.job("CREATE JOB app.nc SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.commits()")
    app.run()
    # the same tick again (as after a crash between the procedure's commit and finalisation)
    app.conn.execute("UPDATE radix.radix_system_job_state SET status = 'scheduled', attempt = 0, "
                     "due_ns = radix.to_ns(clock_timestamp())")
    app.run()
    assert [e[1] for e in app.effects()] == ["effect"]
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        app.conn.execute("SELECT radix.once()")
    assert name


def test_lost_lease_rolls_the_atomic_attempt_back(app: App) -> None:
    """ALTER JOB during an attempt: the attempt's effects never commit (fenced marker)."""
    app.conn.execute(f"GRANT {app.principal} TO current_user")
    app.conn.execute("""CREATE PROCEDURE app.waits() LANGUAGE plpgsql AS $$
        BEGIN
          INSERT INTO app.effects(tag) VALUES ('should roll back');
          PERFORM pg_advisory_xact_lock_shared(4242);
        END $$""")
    name = app.job("CREATE JOB app.w SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.waits()")
    app.make_due(name)
    blocker = psycopg.connect(app.dsn, autocommit=True)
    done = threading.Event()
    blocker.execute("SELECT pg_advisory_lock(4242)")

    def engine_run() -> None:
        app.run()
        done.set()

    thread = threading.Thread(target=engine_run)
    thread.start()
    wait_for(lambda: app.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                      "AND wait_event = 'advisory'").fetchone()[0] == 1,  # type: ignore[index]
             message="the attempt to block")
    app.conn.execute("SET statement_timeout = '10s'")  # ALTER must not wait for the running attempt
    app.conn.execute("SELECT radix.alter_job(%s, false)", (name,))
    app.conn.execute("SELECT radix.alter_job(%s, true)", (name,))
    app.conn.execute("RESET statement_timeout")
    blocker.execute("SELECT pg_advisory_unlock(4242)")
    thread.join(30)
    blocker.close()
    assert done.is_set()
    assert app.effects() == []
    assert app.state(name)["definition_version"] == 3


def test_finish_with_a_stale_token_changes_nothing(app: App) -> None:
    name = app.job("CREATE JOB app.f SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('f')")
    claimed = app.conn.execute("SELECT job_id, lease_token FROM radix.claim_due('test-node', 10)").fetchall()
    assert len(claimed) == 1
    stale = app.conn.execute("SELECT radix.finish_attempt(%s, %s, 'failed', NULL, 0, NULL, true, false)",
                             (claimed[0][0], uuid.uuid4())).fetchone()
    assert stale == (False,)
    assert app.state(name)["status"] == "running"


def _procedure(app: App, body: str, name: str = "app.p") -> None:
    app.conn.execute(f"CREATE PROCEDURE {name}() LANGUAGE plpgsql AS $$ BEGIN {body} END $$")


HARMLESS = {
    "reset role": "RESET ROLE; CALL app.record('after reset role');",
    "reset session authorization": "RESET SESSION AUTHORIZATION; CALL app.record('after reset');",
    "set_config on the frame": "PERFORM set_config('radix.job_id', 'x', false); CALL app.record('cfg');",
}


@pytest.mark.parametrize("body", HARMLESS.values(), ids=HARMLESS.keys())
def test_identity_resets_have_no_effect(app: App, body: str) -> None:
    """Logged in as the principal, there is no other identity to fall back to."""
    _procedure(app, body)
    name = app.job("CREATE JOB app.esc SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.p()")
    app.run()
    (effect,) = app.effects()
    assert effect[2:5] == (app.principal, app.principal, app.state(name)["job_id"])


ESCAPES = {
    "set session authorization": "SET SESSION AUTHORIZATION postgres;",
    "set role superuser": "SET ROLE postgres;",
    "write state": "UPDATE radix.radix_system_job_state SET status = 'complete';",
    "write history": "DELETE FROM radix.radix_system_job_history;",
    "write frames": "DELETE FROM radix.attempt_frames;",
    "fake marker": "PERFORM radix.end_attempt(radix.current_job_id(), gen_random_uuid(), 0, true);",
}


@pytest.mark.parametrize("body", ESCAPES.values(), ids=ESCAPES.keys())
def test_escape_attempts_fail(app: App, body: str) -> None:
    _procedure(app, body)
    name = app.job("CREATE JOB app.esc SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.p()")
    app.run()
    (h,) = app.history(name)
    assert h["status"] == "failed", h
    assert app.state(name)["status"] == "failed"
    assert app.effects() == []


def test_frame_cannot_be_changed_by_the_procedure(app: App) -> None:
    _procedure(app, """
        PERFORM set_config('radix.job_id', '00000000-0000-0000-0000-000000000000', false);
        SET search_path = app, pg_catalog;
        INSERT INTO app.effects(tag, job, key)
        VALUES ('f', radix.current_job_id(), radix.current_idempotency_key());""")
    name = app.job("CREATE JOB app.fr SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.p()")
    app.run()
    (effect,) = app.effects()
    assert effect[4] == app.state(name)["job_id"]


def test_role_left_behind_is_reset_before_the_next_attempt(app: App, roles: Any) -> None:
    other = roles("other", "NOLOGIN")
    app.conn.execute(f"GRANT {other} TO {app.principal}")
    app.conn.execute(f"GRANT INSERT ON app.effects TO {other}")
    app.conn.execute(f"GRANT USAGE ON SCHEMA app TO {other}")
    app.conn.execute(f"GRANT USAGE ON SEQUENCE app.effects_id_seq TO {other}")
    _procedure(app, f"SET ROLE {other}; SET search_path = evil; PERFORM pg_advisory_lock(7);", "app.dirty")
    first = app.job("CREATE JOB app.dirty SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.dirty()")
    app.run(concurrency=1)
    second = app.job("CREATE JOB app.clean SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('c')")
    app.run(concurrency=1)
    (effect,) = app.effects()
    assert effect[2:4] == (app.principal, app.principal)
    assert app.state(first)["status"] == "complete"
    assert app.state(second)["status"] == "complete"


REVOCATIONS = {
    "execute": "REVOKE EXECUTE ON PROCEDURE app.record(text) FROM PUBLIC",
    "usage": "REVOKE USAGE ON SCHEMA app FROM {p}",
    "connect": "REVOKE CONNECT ON DATABASE {db} FROM PUBLIC",
    "set grant": "REVOKE {p} FROM {owner}",
}


@pytest.mark.parametrize("revoke", REVOCATIONS.values(), ids=REVOCATIONS.keys())
def test_revoked_privilege_is_a_redacted_security_failure(app: App, roles: Any, revoke: str) -> None:
    owner = roles("owner")
    app.conn.execute(f"GRANT {app.principal} TO {owner}")
    app.conn.execute(f"GRANT CREATE ON SCHEMA app TO {owner}")
    with psycopg.connect(app.dsn, user=owner, autocommit=True) as as_owner:
        catalog.execute_job_ddl(as_owner, f"CREATE JOB app.r SCHEDULE AT TIMESTAMP '2020-01-01' "
                                          f"RUN AS {app.principal} CALL app.record('r')")
    dbname = app.conn.info.dbname
    app.conn.execute(revoke.format(p=app.principal, db=dbname, owner=owner))
    app.run()
    (h,) = app.history("app.r")
    assert h["status"] == "failed"
    assert h["error"]["category"] == "security"
    assert "redacted" in h["error"]["message"]
    for secret in ("record", "app", app.principal, owner, dbname):
        assert secret not in h["error"]["message"]
    assert app.effects() == []


def test_deadline_trap_is_terminated(app: App) -> None:
    app.conn.execute("""CREATE PROCEDURE app.trap() LANGUAGE plpgsql AS $$
        BEGIN
          LOOP
            BEGIN PERFORM pg_sleep(0.05); EXCEPTION WHEN query_canceled THEN NULL; END;
          END LOOP;
        END $$""")
    app.conn.execute(
        "SELECT radix.create_job('app.trap', '{\"at\": \"2020-01-01\"}', %s, 'app.trap', '[]', true, false, 300)",
        (app.principal,))
    engine = app.run(grace_s=0.5)
    assert engine.counters["terminations"] >= 1
    (h,) = app.history("app.trap")
    assert h["status"] == "retrying"
    assert h["error"]["category"] == "deadline"
    assert h["error"]["detail"]["scheduler_retryable"] is True


def test_history_is_bounded(app: App) -> None:
    name = app.job("CREATE JOB app.h SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('h')")
    job_id = app.state(name)["job_id"]
    app.conn.execute(
        "INSERT INTO radix.radix_system_job_history (job_id, definition_version, planned_ns, attempt, "
        "idempotency_key, status) SELECT %s, 1, g, 1, 'k', 'succeeded' FROM generate_series(1, 300) g", (job_id,))
    app.make_due(name)
    app.run()
    count = app.conn.execute("SELECT count(*) FROM radix.radix_system_job_history WHERE job_id = %s",
                             (job_id,)).fetchone()
    assert count == (256,)


def test_cron_job_coalesces_to_the_latest_due_tick(app: App) -> None:
    name = app.job("CREATE JOB app.cron SCHEDULE CRON '*/5 * * * *' TIME ZONE 'Europe/Berlin' "
                   "RUN AS {p} CALL app.record('cron')")
    assert app.state(name)["planned_ns"] is None  # planned by the engine, which knows cron
    # enabled two hours ago and never served since
    app.conn.execute("UPDATE radix.radix_system_job_state SET anchor_ns = radix.to_ns(clock_timestamp()) - %s, "
                     "due_ns = radix.to_ns(clock_timestamp())", (2 * 3600 * 10**9,))
    engine = app.run()
    assert engine.counters["successes"] == 1
    assert engine.counters["coalesced_ticks"] >= 23
    (effect,) = app.effects()
    ran_at = effect[7]
    assert ran_at.minute % 5 == 0
    assert ran_at.second == 0
    state = app.state(name)
    assert state["planned_ns"] - 300 * 10**9 == app.history(name)[0]["planned_ns"]


def test_a_due_cron_backlog_is_planned_once(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planning pass before each claim plans a due backlog of cron jobs once: after the first pass, the
    jobs whose later ticks are not due are neither locked nor written (their rows' xmin, xmax, updated_at)
    nor evaluated again; a job whose later tick comes due is planned again, coalesced, as before."""
    names = [app.job(f"CREATE JOB app.yearly{i} SCHEDULE CRON '0 0 1 1 *' RUN AS {{p}} CALL app.record('y')")
             for i in range(3)]
    names.append(app.job("CREATE JOB app.kept SCHEDULE CRON '0 0 1 1 *' RUN AS {p} CALL app.record('k') "
                         "WITH (coalesce = off)"))
    yearly = [app.state(name)["job_id"] for name in names]
    fast = app.state(app.job("CREATE JOB app.fast SCHEDULE CRON '* * * * * *' RUN AS {p} CALL app.record('f')"))
    # enabled 1,098 days ago (three Januaries at least), the fast one 10 s ago, never served since: all due
    app.conn.execute("UPDATE radix.radix_system_job_state SET due_ns = radix.to_ns(clock_timestamp()), "
                     "anchor_ns = radix.to_ns(clock_timestamp()) - CASE WHEN job_id = %s::uuid THEN %s::bigint "
                     "ELSE %s::bigint END", (fast["job_id"], 10 * 10**9, 1098 * 86400 * 10**9))
    evaluated: list[str] = []
    next_cron_tick = schedule.next_cron_tick

    def counted(expression: str, time_zone: str, after_ns: int) -> int:
        evaluated.append(expression)
        return next_cron_tick(expression, time_zone, after_ns)

    monkeypatch.setattr(schedule, "next_cron_tick", counted)

    def rows() -> dict[Any, tuple[Any, ...]]:  # job -> (xmin, xmax, updated_at, planned_ns, coalesced_ticks)
        return {r[0]: r[1:] for r in app.conn.execute(
            "SELECT job_id, xmin::text, xmax::text, updated_at, planned_ns, coalesced_ticks "
            "FROM radix.radix_system_job_state")}

    async def passes() -> list[dict[Any, tuple[Any, ...]]]:
        planner = CronPlanner()
        seen = []
        async with await aconnect(app.dsn) as conn:
            for pause in (0, 0, 0, 2.1):
                await asyncio.sleep(pause)
                evaluated.clear()
                await planner.plan_cron(conn)
                seen.append(rows())
                if len(seen) > 1:
                    assert "0 0 1 1 *" not in evaluated  # remembered: no later tick due
        return seen

    first, *later, after_pause = asyncio.run(passes())
    assert first[yearly[0]][4] >= 2  # coalesced to the latest January
    assert first[yearly[-1]][4] == 0  # coalesce off: the oldest January runs first
    assert first[yearly[-1]][3] < first[yearly[0]][3]
    for seen in (*later, after_pause):
        assert [seen[job_id] for job_id in yearly] == [first[job_id] for job_id in yearly]
    job_id = fast["job_id"]
    assert after_pause[job_id][3] >= first[job_id][3] + 2 * 10**9  # two later ticks came due: the latest
    assert after_pause[job_id][4] >= first[job_id][4] + 1
    assert after_pause[job_id][2] > first[job_id][2]


def test_a_claim_whose_non_atomic_attempt_began_is_not_handed_back(app: App) -> None:
    """A node's shutdown hands back only the claims it never began: a non-atomic attempt whose begin committed
    (its backend then gone, its outcome never recorded) may have committed effects, so its tick is kept and
    resumed with the same key once the node is gone, not released and coalesced away."""
    _procedure(app, "COMMIT; CALL app.record('step');")
    name = app.job("CREATE JOB app.n SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.p()")
    app.conn.execute("UPDATE radix.jobs SET non_atomic = true")
    app.make_due(name)
    app.conn.execute("SELECT radix.register_node('gone', 'localhost', 0)")
    ((job_id, token, planned),) = app.conn.execute(
        "SELECT job_id, lease_token, planned_ns FROM radix.claim_due('gone', 10)").fetchall()
    with psycopg.connect(app.dsn, user=app.principal, autocommit=True) as principal:
        principal.execute("SELECT radix.begin_attempt(%s, %s)", (job_id, token))
    assert app.conn.execute("SELECT radix.release_claims('gone')").fetchone() == (0,)
    state = app.state(name)
    assert (state["status"], state["planned_ns"], state["attempt"]) == ("running", planned, 1)
    # a claim that never began is handed back
    app.conn.execute("UPDATE radix.attempt_frames SET lease_token = gen_random_uuid() WHERE job_id = %s", (job_id,))
    assert app.conn.execute("SELECT radix.release_claims('gone')").fetchone() == (1,)
    assert app.state(name)["status"] == "scheduled"
