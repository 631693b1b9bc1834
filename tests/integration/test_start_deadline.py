"""Start deadlines (``WITH (start_deadline = …)``): a tick that cannot start within its deadline is recorded
'missed' and skipped, on every path that starts a tick (the finder and begin_tick, a batch's start_ticks,
the lease path's claim_due); a retry is never missed. The clock is made late by moving a job's tick into the
past, never by waiting."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from radixjobs import catalog
from radixjobs.engine.attempt import attempt_mac
from radixjobs.engine.ticks import Tick
from tests.apps import App, batch_outcomes, definitions, found_ticks

MINUTE_NS = 60 * 10**9
FIVE_MIN_NS = 5 * MINUTE_NS


def _late(app: App, name: str, ago_ns: int) -> int:
    """Put the job's tick (and its grid) ``ago_ns`` in the past, due since then; returns the tick."""
    row = app.conn.execute(
        "UPDATE radix.radix_system_job_state SET planned_ns = t, anchor_ns = t, due_ns = t "
        "FROM (SELECT radix.to_ns(clock_timestamp()) - %s AS t) AS past "
        "WHERE job_id = (SELECT job_id FROM radix.job_overview WHERE name = %s) RETURNING planned_ns",
        (ago_ns, name)).fetchone()
    assert row is not None
    return int(row[0])


def _statuses(app: App, name: str) -> list[tuple[str, int, int, str]]:
    return [(h["status"], h["planned_ns"], h["attempt"], h["run_kind"]) for h in app.history(name)]


def test_a_tick_past_its_start_deadline_is_missed_and_the_next_tick_runs(app: App) -> None:
    name = app.job("CREATE JOB app.d SCHEDULE EVERY INTERVAL '5 minutes' RUN AS {p} CALL app.record('d') "
                   "WITH (start_deadline = '1 minute')")
    tick = _late(app, name, 2 * MINUTE_NS)
    engine = app.run()
    assert engine.counters["successes"] == 0
    assert app.effects() == []
    assert _statuses(app, name) == [("missed", tick, 0, "schedule")]
    (missed,) = app.history(name)
    assert missed["error"]["kind"] == "missed"
    state = app.state(name)
    assert (state["status"], state["planned_ns"], state["attempt"]) == ("scheduled", tick + FIVE_MIN_NS, 0)
    app.make_due(name)  # the next tick, on time
    assert app.run().counters["successes"] == 1
    assert _statuses(app, name)[-1] == ("succeeded", tick + FIVE_MIN_NS, 1, "schedule")


def test_a_tick_within_its_start_deadline_runs(app: App) -> None:
    name = app.job("CREATE JOB app.d SCHEDULE EVERY INTERVAL '5 minutes' RUN AS {p} CALL app.record('d') "
                   "WITH (start_deadline = '1 minute')")
    tick = _late(app, name, 30 * 10**9)
    assert app.run().counters["successes"] == 1
    assert _statuses(app, name) == [("succeeded", tick, 1, "schedule")]


def test_coalesced_ticks_are_counted_and_the_tick_chosen_is_missed(app: App) -> None:
    name = app.job("CREATE JOB app.d SCHEDULE EVERY INTERVAL '5 minutes' RUN AS {p} CALL app.record('d') "
                   "WITH (start_deadline = '1 minute')")
    first = _late(app, name, 24 * FIVE_MIN_NS + 2 * MINUTE_NS)
    app.run()
    assert app.effects() == []
    assert _statuses(app, name) == [("missed", first + 24 * FIVE_MIN_NS, 0, "schedule")]
    state = app.state(name)
    assert (state["coalesced_ticks"], state["planned_ns"]) == (24, first + 25 * FIVE_MIN_NS)


def test_with_coalesce_off_each_tick_past_its_deadline_is_missed(app: App) -> None:
    name = app.job("CREATE JOB app.d SCHEDULE EVERY INTERVAL '5 minutes' RUN AS {p} CALL app.record('d') "
                   "WITH (start_deadline = '1 minute', coalesce = off)")
    first = _late(app, name, 3 * FIVE_MIN_NS + 2 * MINUTE_NS)
    app.run()
    assert app.effects() == []
    assert _statuses(app, name) == [("missed", first + k * FIVE_MIN_NS, 0, "schedule") for k in range(4)]
    state = app.state(name)
    assert (state["coalesced_ticks"], state["planned_ns"]) == (0, first + 4 * FIVE_MIN_NS)


def test_an_at_job_whose_tick_is_missed_fails(app: App) -> None:
    name = app.job("CREATE JOB app.d SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('d') "
                   "WITH (start_deadline = '10 minutes')")
    app.run()
    assert app.effects() == []
    state = app.state(name)
    assert state["status"] == "failed"
    assert state["last_error"]["kind"] == "missed"
    assert [h["status"] for h in app.history(name)] == ["missed"]


def test_a_request_and_a_job_without_deadline_are_never_missed(app: App) -> None:
    plain = app.job("CREATE JOB app.p SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('p')")
    asked = app.job("CREATE JOB app.r SCHEDULE EVERY INTERVAL '1 day' RUN AS {p} CALL app.record('r') "
                    "WITH (start_deadline = '1 second')")
    app.conn.execute("SELECT radix.run_job('app.r')")
    app.run()
    assert [h["status"] for h in app.history(plain)] == ["succeeded"]
    assert [(h["status"], h["run_kind"]) for h in app.history(asked)] == [("succeeded", "run")]


def test_a_retry_of_a_tick_is_not_missed(app: App) -> None:
    """The deadline is about a tick's first attempt: a tick that started in time and failed is retried
    whatever its lateness."""
    app.conn.execute("CREATE TABLE app.fails (n int); INSERT INTO app.fails VALUES (1)")
    app.conn.execute("CREATE PROCEDURE app.flaky() LANGUAGE plpgsql AS $$ BEGIN "
                     "IF (SELECT n FROM app.fails) > 0 THEN RAISE EXCEPTION 'busy' USING ERRCODE = '40001'; END IF; "
                     "INSERT INTO app.effects(tag) VALUES ('ok'); END $$")
    app.conn.execute(f"GRANT EXECUTE ON PROCEDURE app.flaky() TO {app.principal}; "
                     f"GRANT SELECT ON app.fails TO {app.principal}")
    name = app.job("CREATE JOB app.f SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.flaky() "
                   "WITH (start_deadline = '1 minute')")
    tick = _late(app, name, 30 * 10**9)
    app.run()
    assert app.state(name)["status"] == "retry_wait"
    app.conn.execute("UPDATE app.fails SET n = 0")
    # the retry is due long after the tick's deadline
    app.conn.execute("UPDATE radix.radix_system_job_state SET due_ns = radix.to_ns(clock_timestamp()) "
                     "WHERE job_id = %s", (app.state(name)["job_id"],))
    app.conn.execute("UPDATE radix.radix_system_job_state SET planned_ns = planned_ns - %s, "
                     "idempotency_key = job_id::text || '/' || (planned_ns - %s)::text WHERE job_id = %s",
                     (10 * MINUTE_NS, 10 * MINUTE_NS, app.state(name)["job_id"]))
    app.run()
    assert [h["status"] for h in app.history(name)] == ["retrying", "succeeded"]
    assert [e[1] for e in app.effects()] == ["ok"]
    assert tick - 10 * MINUTE_NS == app.history(name)[-1]["planned_ns"]


def test_the_lease_path_records_a_missed_tick_instead_of_claiming_it(app: App) -> None:
    name = app.job("CREATE JOB app.d SCHEDULE EVERY INTERVAL '5 minutes' RUN AS {p} CALL app.record('d') "
                   "WITH (start_deadline = '1 minute')")
    tick = _late(app, name, 2 * MINUTE_NS)
    claimed = app.conn.execute("SELECT * FROM radix.claim_due('n', 10)").fetchall()
    assert claimed == []
    assert _statuses(app, name) == [("missed", tick, 0, "schedule")]
    assert app.state(name)["planned_ns"] == tick + FIVE_MIN_NS


def test_a_cron_tick_past_its_deadline_is_missed_and_the_next_one_planned(app: App) -> None:
    name = app.job("CREATE JOB app.c SCHEDULE CRON '*/5 * * * *' RUN AS {p} CALL app.record('c') "
                   "WITH (start_deadline = '1 second')")
    app.run()  # plans the first tick (in the future) and runs nothing
    state = app.state(name)
    tick = state["planned_ns"]
    # the planned tick is late: due since 10 minutes past it
    app.conn.execute("UPDATE radix.radix_system_job_state SET planned_ns = planned_ns - %s, "
                     "due_ns = planned_ns - %s WHERE job_id = %s",
                     (2 * FIVE_MIN_NS, 2 * FIVE_MIN_NS, state["job_id"]))
    app.run()
    assert app.effects() == []
    # the daemon's planning coalesced the late tick to the latest due one, which is past its deadline
    assert _statuses(app, name) == [("missed", tick - FIVE_MIN_NS, 0, "schedule")]
    state = app.state(name)
    assert state["coalesced_ticks"] == 1
    # planned again from the missed tick: the next one, on time
    app.run()
    assert app.state(name)["planned_ns"] == tick


def _begin(principal: psycopg.Connection[Any], tick: Tick) -> tuple[str | None, str | None]:
    session = principal.execute("SELECT radix.attempt_session()").fetchone()
    assert session is not None
    mac = attempt_mac(bytes.fromhex(session[0]), tick.token)
    row = principal.execute("SELECT * FROM radix.start_tick(%s, %s, %s)",
                            (tick.job_id, tick.planned_ns, mac)).fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_tick_found_in_time_and_started_past_its_deadline_is_refused_then_missed(app: App) -> None:
    """The start itself checks the deadline (radix.start_tick, as begin_tick and a batch's start_ticks do):
    a tick found in time and started late runs nothing, and the next find records it missed."""
    name = app.job("CREATE JOB app.d SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('d')")
    (tick,) = found_ticks(app)
    # the deadline as it stands when the tick starts (set under the token: the state row is unchanged)
    app.conn.execute("UPDATE radix.jobs SET start_deadline_ns = 1")
    with psycopg.connect(app.dsn, user=app.principal) as principal:
        sqlstate, message = _begin(principal, tick)
        principal.rollback()
    assert sqlstate == "RXT01"
    assert "start deadline" in str(message)
    assert app.history(name) == []
    assert found_ticks(app) == []
    assert [h["status"] for h in app.history(name)] == ["missed"]


@pytest.mark.parametrize("option", ["jitter", "start_deadline"])
def test_interval_options_refuse_bad_values_in_one_line(app: App, option: str) -> None:
    app.job("CREATE JOB app.o SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('o')")
    for value, message in [("'0 seconds'", "interval must be positive"),
                           ("'-5 minutes'", "interval must be positive"),
                           ("5", f"{option} must be an interval string"),
                           ("'soon'", f"{option}: "),
                           ("'1 month'", "calendar unit 'month' is not allowed")]:
        with pytest.raises(Exception, match=message) as caught:
            app.job(f"ALTER JOB app.o SET ({option} = {value})")
        assert "\n" not in str(caught.value)
    # the database's own check, for SQL callers
    for value, message in [('"0 seconds"', "must be at least 1 millisecond"), ("5", "must be an interval string"),
                           ('"soon"', "invalid interval"), ('"1 mon"', "calendar units"),
                           # past 100 years a tick's time plus the option would not fit a bigint
                           ('"100000 days"', "must be at most 100 years")]:
        with pytest.raises(psycopg.Error, match=message) as refused:
            app.conn.execute(f"SELECT radix.alter_job('app.o', options => '{{\"{option}\": {value}}}')")
        assert "\n" not in (refused.value.diag.message_primary or "\n")
        app.conn.rollback()


def test_start_deadline_is_stored_shown_altered_and_reset_without_a_rearm(app: App) -> None:
    name = app.job("CREATE JOB app.o SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('o') "
                   "WITH (start_deadline = '10 minutes')")
    before = app.state(name)
    assert before["start_deadline_ns"] == 10 * MINUTE_NS
    app.job("ALTER JOB app.o SET (start_deadline = '90 seconds')")
    after = app.state(name)
    assert after["start_deadline_ns"] == 90 * 10**9
    assert (after["planned_ns"], after["due_ns"]) == (before["planned_ns"], before["due_ns"])
    app.job("ALTER JOB app.o RESET (start_deadline)")
    assert app.state(name)["start_deadline_ns"] is None


@pytest.mark.usefixtures("batchable")
def test_a_batch_does_not_start_a_tick_past_its_deadline(app: App) -> None:
    """radix.start_ticks checks the deadline as start_tick does: that tick is refused (RXT01, nothing ran),
    the others of the batch run, and the next find records it missed."""
    names = [app.job(f"CREATE JOB app.b{i} SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {{p}} CALL app.record('b{i}') "
                     "WITH (batch = on)") for i in range(3)]
    found = found_ticks(app)
    cached = definitions(app, found)
    late = app.state(names[1])["job_id"]
    app.conn.execute("UPDATE radix.jobs SET start_deadline_ns = 1 WHERE job_id = %s", (late,))
    outcomes = batch_outcomes(app, found, cached)
    assert outcomes[late][:2] == ("begin", "RXT01")
    assert all(r[0] is None for job, r in outcomes.items() if job != late)
    assert sorted(e[1] for e in app.effects()) == ["b0", "b2"]
    assert found_ticks(app) == []
    assert [h["status"] for h in app.history(names[1])] == ["missed"]
    assert app.state(names[1])["status"] == "failed"


def test_the_sweep_passes_a_job_an_open_alter_holds_and_keeps_its_rearm(app: App) -> None:
    """A tick past its deadline whose state row an ALTER JOB holds (its transaction open) is neither waited on
    by the finder's sweep nor recorded over the re-arm: the sweep passes it by; after the ALTER commits the
    job is at its new tick."""
    name = app.job("CREATE JOB app.d SCHEDULE EVERY INTERVAL '5 minutes' RUN AS {p} CALL app.record('d') "
                   "WITH (start_deadline = '1 minute')")
    _late(app, name, 2 * MINUTE_NS)
    with psycopg.connect(app.dsn, autocommit=False) as holder:
        catalog.execute_job_ddl(holder, "ALTER JOB app.d SET SCHEDULE EVERY INTERVAL '7 minutes'")
        app.conn.execute("SET statement_timeout = '20s'")  # a wait fails the test rather than hang it
        assert found_ticks(app) == []
        app.conn.execute("RESET statement_timeout")
        assert _statuses(app, name) == []
        holder.commit()
    state = app.state(name)
    assert _statuses(app, name) == []
    assert state["status"] == "scheduled"
    assert state["planned_ns"] > _now_ns(app)  # the re-arm's tick


def _now_ns(app: App) -> int:
    row = app.conn.execute("SELECT radix.to_ns(clock_timestamp())").fetchone()
    assert row is not None
    return int(row[0])
