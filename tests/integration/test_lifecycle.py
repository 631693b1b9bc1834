"""Changing a job without losing it (issue #13): RUN JOB, backfill, ALTER JOB ... SET / RESET / RENAME,
CREATE OR REPLACE JOB and the options, through DDL, SQL functions and the Python API, on a real server."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import psycopg
import pytest
from psycopg import sql

from radixjobs import catalog
from radixjobs.engine import Engine
from radixjobs.errors import AdmissionError, ParseError
from tests.apps import App, run_engine
from tests.support import wait_for

HOURLY = "SCHEDULE EVERY INTERVAL '1 hour'"
HOUR_NS = 3_600 * 10**9


def _job_id(app: App, name: str) -> str:
    return str(app.state(name)["job_id"])


def _counts(app: App, name: str) -> dict[str, int]:
    rows = app.conn.execute("SELECT status, count(*) FROM radix.job_history WHERE name = %s GROUP BY status",
                            (name,)).fetchall()
    return {status: int(n) for status, n in rows}


def _drain(app: App, name: str) -> None:
    """Run due work until the job has no request queued or in progress."""
    def idle() -> bool:
        app.run()
        job = app.state(name)
        return bool(job["queued_runs"] == 0 and job["request_kind"] is None)

    wait_for(idle)


# -- RUN JOB ------------------------------------------------------------------------------------------

def test_run_job_runs_now_with_its_own_key_and_keeps_the_schedule(app: App) -> None:
    name = app.job(f"CREATE JOB app.now {HOURLY} RUN AS {{p}} CALL app.record('now')")
    planned = app.state(name)["planned_ns"]
    catalog.execute_job_ddl(app.conn, "RUN JOB app.now;")
    app.run()
    effects = app.effects()
    assert len(effects) == 1
    key = effects[0][6]
    assert key.startswith(_job_id(app, name) + "/")
    assert int(key.split("/")[1]) != planned
    history = app.history(name)
    assert [(h["status"], h["run_kind"]) for h in history] == [("succeeded", "run")]
    state = app.state(name)
    assert (state["status"], state["planned_ns"], state["request_kind"]) == ("scheduled", planned, None)


def test_run_job_works_on_a_disabled_job_and_leaves_it_disabled(app: App) -> None:
    name = app.job(f"CREATE JOB app.off {HOURLY} RUN AS {{p}} CALL app.record('off') DISABLE")
    key = catalog.run_job(app.conn, name)
    app.run()
    assert [e[6] for e in app.effects()] == [key]
    state = app.state(name)
    assert (state["status"], state["enabled"], state["next_run_at"]) == ("disabled", False, None)


def test_run_job_of_a_completed_one_time_job_keeps_it_complete(app: App) -> None:
    name = app.job("CREATE JOB app.once SCHEDULE AT TIMESTAMP '2000-01-01T00:00:00Z' RUN AS {p} "
                   "CALL app.record('once')")
    app.run()
    assert app.state(name)["status"] == "complete"
    catalog.run_job(app.conn, name)
    app.run()
    assert len(app.effects()) == 2
    assert app.state(name)["status"] == "complete"


def test_run_job_waits_for_a_running_attempt(app: App) -> None:
    """A RUN JOB during an attempt is queued and runs after it: never two attempts of one job at once."""
    app.conn.execute("""
        CREATE TABLE app.gate (id int PRIMARY KEY);
        GRANT SELECT ON app.gate TO {p};
        CREATE PROCEDURE app.slow(tag text) LANGUAGE plpgsql AS $$
        BEGIN
          INSERT INTO app.effects (tag, key, at) VALUES (tag || ':start', radix.current_idempotency_key(),
                                                         clock_timestamp());
          PERFORM 1 FROM app.gate WHERE id = 1 FOR KEY SHARE;  -- waits while the test holds the gate
          INSERT INTO app.effects (tag, key, at) VALUES (tag || ':end', radix.current_idempotency_key(),
                                                         clock_timestamp());
        END $$;
        INSERT INTO app.gate VALUES (1);
    """.replace("{p}", app.principal).encode())
    app.conn.execute(sql.SQL("GRANT UPDATE ON app.gate TO {}").format(sql.Identifier(app.principal)))
    name = app.job(f"CREATE JOB app.slowjob {HOURLY} RUN AS {{p}} CALL app.slow('a')")
    holder = psycopg.connect(app.dsn)
    holder.execute("SELECT 1 FROM app.gate WHERE id = 1 FOR UPDATE")
    first = catalog.run_job(app.conn, name)

    async def scenario() -> None:
        async with Engine(app.dsn, concurrency=4) as engine:
            await engine.dispatch_due()
            await asyncio.to_thread(wait_for, lambda: app.state(name)["status"] == "running")
            second = catalog.run_job(app.conn, name)  # queued behind the running attempt
            assert app.state(name)["queued_runs"] == 1
            await engine.dispatch_due()  # nothing claimable: the job is running
            assert app.state(name)["queued_runs"] == 1
            holder.rollback()
            await asyncio.to_thread(wait_for, lambda: (app.state(name)["queued_runs"], app.state(name)["status"],
                                                       app.state(name)["request_kind"]) == (0, "scheduled", "run"))
            await engine.run_due()
            await asyncio.to_thread(wait_for, lambda: engine.running == 0)
            keys = [h["idempotency_key"] for h in app.history(name)]
            assert keys == [first, second]

    try:
        asyncio.run(scenario())
    finally:
        holder.close()
    tags = [e[1] for e in app.effects()]
    assert tags == ["a:start", "a:end", "a:start", "a:end"]  # one after the other, never interleaved


def test_run_job_needs_the_rights_of_alter(app: App, roles: Any) -> None:
    name = app.job(f"CREATE JOB app.mine {HOURLY} RUN AS {{p}} CALL app.record('x')")
    stranger = roles("stranger")
    with psycopg.connect(app.dsn, user=stranger, autocommit=True) as other, \
            pytest.raises(AdmissionError, match=r"does not exist|must be owner"):
        catalog.run_job(other, name)
    assert app.conn.execute("SELECT count(*) FROM radix.job_requests").fetchone() == (0,)


# -- backfill -----------------------------------------------------------------------------------------

def _backfill_job(app: App) -> str:
    return app.job("CREATE JOB app.fill SCHEDULE EVERY INTERVAL '1 hour' STARTING AT TIMESTAMP "
                   "'2026-01-01T00:00:00Z' RUN AS {p} CALL app.record('fill')")


def test_backfill_runs_each_tick_once_even_when_repeated(app: App) -> None:
    app.conn.execute("CREATE UNIQUE INDEX effects_key ON app.effects (key)")  # a duplicate would fail
    name = _backfill_job(app)
    stmt = "RUN JOB app.fill FOR RANGE TIMESTAMP '2026-01-02T00:00:00Z' TO TIMESTAMP '2026-01-02T05:00:00Z'"
    assert catalog.execute_job_ddl(app.conn, stmt) == "RUN JOB 5"
    _drain(app, name)
    ticks = sorted(int(e[6].split("/")[1]) for e in app.effects())
    base = catalog._as_ns(dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    assert ticks == [base + k * HOUR_NS for k in range(5)]
    assert catalog.execute_job_ddl(app.conn, stmt) == "RUN JOB 0"  # nothing left to do
    # after the history was pruned, the ledger still knows the ticks are done
    catalog.alter_job(app.conn, name, options={"history": 1})
    catalog.run_job(app.conn, name)
    _drain(app, name)
    assert catalog.execute_job_ddl(app.conn, stmt) == "RUN JOB 0"
    assert {h["run_kind"] for h in app.history(name)} == {"run"}


def test_a_repeated_backfill_does_not_queue_the_tick_in_progress(app: App) -> None:
    name = _backfill_job(app)
    stmt = "RUN JOB app.fill FOR RANGE TIMESTAMP '2026-01-02T00:00:00Z' TO TIMESTAMP '2026-01-02T03:00:00Z'"
    assert catalog.execute_job_ddl(app.conn, stmt) == "RUN JOB 3"
    assert app.state(name)["request_kind"] == "backfill"  # the oldest is the current tick, the rest queued
    assert catalog.execute_job_ddl(app.conn, stmt) == "RUN JOB 0"
    _drain(app, name)
    assert len(app.effects()) == 3


def test_backfill_is_bounded_and_stoppable(app: App) -> None:
    name = _backfill_job(app)
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.fill SET SCHEDULE EVERY INTERVAL '1 minute' "
                                      "STARTING AT TIMESTAMP '2026-01-01T00:00:00Z'")
    with pytest.raises(AdmissionError, match="above the limit of 10000"):
        catalog.backfill_job(app.conn, name, dt.datetime(2026, 1, 1), dt.datetime(2026, 2, 1))
    assert app.state(name)["queued_runs"] == 0
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.fill SET SCHEDULE EVERY INTERVAL '1 hour' "
                                      "STARTING AT TIMESTAMP '2026-01-01T00:00:00Z'")
    assert catalog.execute_job_ddl(
        app.conn, "RUN JOB app.fill FOR RANGE TIMESTAMP '2026-01-01T01:00:00Z' TO TIMESTAMP '2026-01-10'") == \
        "RUN JOB 215"
    catalog.alter_job(app.conn, name, enabled=False)
    assert app.state(name)["queued_runs"] == 0
    _drain(app, name)
    assert app.effects() == []


def test_backfill_of_a_cron_job_uses_the_cron_ticks(app: App) -> None:
    name = app.job("CREATE JOB app.cronfill SCHEDULE CRON '0 */6 * * *' RUN AS {p} CALL app.record('c')")
    assert catalog.execute_job_ddl(app.conn, "RUN JOB app.cronfill FOR RANGE TIMESTAMP '2026-03-01' "
                                             "TO TIMESTAMP '2026-03-02'") == "RUN JOB 4"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="computed by radixjobs"):
        app.conn.execute("SELECT radix.backfill_job(%s, '2026-03-01', '2026-03-02')", (name,))
    _drain(app, name)
    assert len(app.effects()) == 4


def test_backfill_from_sql(app: App) -> None:
    name = _backfill_job(app)
    row = app.conn.execute("SELECT radix.backfill_job(%s, '2026-01-01T10:00:00Z', '2026-01-01T13:30:00Z')",
                           (name,)).fetchone()
    assert row == (4,)


# -- ALTER JOB ... SET / RESET / RENAME ------------------------------------------------------------------

def test_alter_set_schedule_keeps_history_and_recomputes_the_tick(app: App) -> None:
    name = app.job(f"CREATE JOB app.alt {HOURLY} RUN AS {{p}} CALL app.record('x')")
    catalog.run_job(app.conn, name)
    app.run()
    before = app.state(name)
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.alt SET SCHEDULE EVERY INTERVAL '30 minutes'")
    after = app.state(name)
    assert after["job_id"] == before["job_id"]
    assert after["definition_version"] == before["definition_version"] + 1
    assert after["interval_ns"] == HOUR_NS // 2
    # the grid anchor is kept: the next tick is on anchor + k * 30 min
    anchor = app.conn.execute("SELECT anchor_ns FROM radix.radix_system_job_state WHERE job_id = %s",
                              (after["job_id"],)).fetchone()
    assert anchor is not None
    assert (after["planned_ns"] - anchor[0]) % (HOUR_NS // 2) == 0
    assert len(app.history(name)) == 1


def _ns(text: str) -> int:
    return catalog._as_ns(dt.datetime.fromisoformat(text))


def _now_ns(app: App) -> int:
    row = app.conn.execute("SELECT radix.to_ns(clock_timestamp())").fetchone()
    assert row is not None
    return int(row[0])


def test_starting_at_ahead_is_the_first_tick_on_create_alter_and_enable(app: App) -> None:
    start = "2226-12-10T00:00:00+00:00"
    name = app.job(f"CREATE JOB app.later {HOURLY} STARTING AT TIMESTAMP '{start}' RUN AS {{p}} "
                   "CALL app.record('x')")
    assert app.state(name)["planned_ns"] == _ns(start)
    catalog.alter_job(app.conn, name, enabled=False)
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.later ENABLE")
    assert app.state(name)["planned_ns"] == _ns(start)
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.later SET SCHEDULE EVERY INTERVAL '1 day' STARTING AT "
                                      "TIMESTAMP '2226-12-11T06:00:00Z'")
    assert app.state(name)["planned_ns"] == _ns("2226-12-11T06:00:00+00:00")


def test_starting_at_past_owes_nothing_from_before_the_job(app: App) -> None:
    start = _ns("2026-01-01T00:00:00+00:00")
    before = _now_ns(app)
    name = app.job(f"CREATE JOB app.past {HOURLY} STARTING AT TIMESTAMP '2026-01-01T00:00:00Z' RUN AS {{p}} "
                   "CALL app.record('x')")
    planned = app.state(name)["planned_ns"]
    assert (planned - start) % HOUR_NS == 0
    assert before < planned <= _now_ns(app) + HOUR_NS  # the first grid point after creation


def test_backfill_counts_starting_at_as_a_tick(app: App) -> None:
    _backfill_job(app)  # STARTING AT 2026-01-01T00:00:00Z, hourly
    assert catalog.execute_job_ddl(app.conn, "RUN JOB app.fill FOR RANGE TIMESTAMP '2025-12-31T22:00:00Z' TO "
                                             "TIMESTAMP '2026-01-01T02:00:00Z'") == "RUN JOB 2"  # 00:00, 01:00


def test_alter_set_run_as_call_and_options(app: App, roles: Any) -> None:
    name = app.job(f"CREATE JOB app.multi {HOURLY} RUN AS {{p}} CALL app.record('x')")
    other = roles("other")
    app.conn.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {0}; GRANT INSERT, SELECT ON app.effects TO {0}; "
                             "GRANT USAGE ON SEQUENCE app.effects_id_seq TO {0}").format(sql.Identifier(other)))
    catalog.execute_job_ddl(app.conn, f"ALTER JOB app.multi SET RUN AS {other}, SET CALL app.record(tag => 'y'), "
                                      "SET (timeout = '2 hours', max_attempts = 3, history = 1000, coalesce = off, "
                                      "batch = on)")
    job = app.state(name)
    assert (job["principal"], job["deadline_ms"], job["max_attempts"], job["history_limit"],
            job["coalesce_ticks"], job["batch_ticks"]) == (other, 7_200_000, 3, 1000, False, True)
    assert job["arguments"][0]["value"] == "y"
    catalog.run_job(app.conn, name)
    app.run()
    assert [(e[1], e[2]) for e in app.effects()] == [("y", other)]
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.multi RESET (timeout, max_attempts, history, coalesce, batch)")
    job = app.state(name)
    assert (job["deadline_ms"], job["max_attempts"], job["history_limit"], job["coalesce_ticks"],
            job["batch_ticks"]) == (240_000, 5, 256, True, False)


def test_alter_refusals_write_nothing(app: App, roles: Any) -> None:
    name = app.job(f"CREATE JOB app.ref {HOURLY} RUN AS {{p}} CALL app.record('x')")
    version = app.state(name)["definition_version"]
    superuser = roles("boss", "LOGIN SUPERUSER")
    owner = roles("owner")
    app.conn.execute(sql.SQL("GRANT CREATE, USAGE ON SCHEMA app TO {0}; GRANT {1} TO {0}; "
                             "GRANT EXECUTE ON PROCEDURE app.record(text) TO {0}")
                     .format(sql.Identifier(owner), sql.Identifier(app.principal)))
    with psycopg.connect(app.dsn, user=owner, autocommit=True) as c:
        catalog.execute_job_ddl(c, f"CREATE JOB app.owned {HOURLY} RUN AS {app.principal} CALL app.record('x')")
        with pytest.raises(AdmissionError, match="permission denied to schedule a job as role"):
            catalog.execute_job_ddl(c, f"ALTER JOB app.owned SET RUN AS {superuser}")
        c.execute(b"CREATE PROCEDURE app.needs_int(n int) LANGUAGE plpgsql AS $$ BEGIN END $$")
        with pytest.raises(AdmissionError, match="invalid input syntax for type integer"):
            catalog.execute_job_ddl(c, "ALTER JOB app.owned SET CALL app.needs_int('abc')")
        with pytest.raises(AdmissionError, match="must be owner"):
            catalog.execute_job_ddl(c, "ALTER JOB app.ref SET (history = 5)")
    with pytest.raises(AdmissionError, match="does not exist"):
        catalog.execute_job_ddl(app.conn, "ALTER JOB app.ref SET CALL app.nope()")
    with pytest.raises(ParseError, match="max_attempts must be an integer from 1 to 10"):
        catalog.execute_job_ddl(app.conn, "ALTER JOB app.ref SET (max_attempts = 11)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="history must be an integer"):
        app.conn.execute("SELECT radix.alter_job(%s, options => '{\"history\": 0}')", (name,))
    assert app.state(name)["definition_version"] == version
    assert app.state("app.owned")["principal"] == app.principal


def test_set_call_resolves_overloads_as_call_does(app: App) -> None:
    """SET CALL goes through the same resolution as CREATE JOB: an ambiguous call is refused (42725), a
    resolvable one binds the overload CALL would pick; the refused change writes nothing."""
    app.conn.execute(b"CREATE PROCEDURE app.ov(a bigint) LANGUAGE plpgsql AS $$ BEGIN END $$; "
                     b"CREATE PROCEDURE app.ov(a numeric) LANGUAGE plpgsql AS $$ BEGIN END $$; "
                     b"CREATE PROCEDURE app.ov(a text, b int) LANGUAGE plpgsql AS $$ BEGIN END $$")
    name = app.job(f"CREATE JOB app.over {HOURLY} RUN AS {{p}} CALL app.record('x')")
    with pytest.raises(AdmissionError) as refused:
        catalog.execute_job_ddl(app.conn, "ALTER JOB app.over SET CALL app.ov(1)")
    assert refused.value.code == "42725"
    assert app.state(name)["procedure"] == "app.record(text)"
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.over SET CALL app.ov('x', 2)")
    assert app.state(name)["procedure"] == "app.ov(text,integer)"


def test_rename_keeps_the_job_and_its_history(app: App) -> None:
    name = app.job(f"CREATE JOB app.old {HOURLY} RUN AS {{p}} CALL app.record('x')")
    job_id = _job_id(app, name)
    catalog.run_job(app.conn, name)
    app.run()
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.old RENAME TO app.new")
    assert catalog.get_job(app.conn, "app.old") is None
    assert _job_id(app, "app.new") == job_id
    assert len(app.history("app.new")) == 1
    app.job(f"CREATE JOB app.taken {HOURLY} RUN AS {{p}} CALL app.record('x')")
    with pytest.raises(AdmissionError, match="already exists"):
        catalog.execute_job_ddl(app.conn, "ALTER JOB app.new RENAME TO app.taken")


def _asleep(app: App) -> bool:
    """Is a backend of the principal inside pg_sleep?"""
    row = app.conn.execute("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE usename = %s "
                           "AND wait_event = 'PgSleep')", (app.principal,)).fetchone()
    return bool(row and row[0])


def test_alter_during_an_atomic_attempt_fences_it_and_never_overlaps(app: App) -> None:
    """SET SCHEDULE while an attempt runs: the old attempt cannot commit (its lease is gone), and the next
    attempt does not start while the old backend still runs."""
    app.conn.execute(b"CREATE PROCEDURE app.sleepy() LANGUAGE plpgsql AS $$ BEGIN "
                     b"INSERT INTO app.effects (tag) VALUES ('sleepy'); PERFORM pg_sleep(2); END $$")
    name = app.job(f"CREATE JOB app.sleeper {HOURLY} RUN AS {{p}} CALL app.sleepy()")
    catalog.run_job(app.conn, name)

    async def scenario() -> None:
        async with Engine(app.dsn, concurrency=2, lease_s=3) as engine:
            await engine.dispatch_due()
            # the procedure itself running (its backend asleep in it), not only claimed: an ALTER before the
            # attempt began would refuse it at once, and it could end before the next dispatch
            await asyncio.to_thread(wait_for, lambda: _asleep(app))
            catalog.execute_job_ddl(app.conn, "ALTER JOB app.sleeper SET SCHEDULE EVERY INTERVAL '2 hours'")
            catalog.run_job(app.conn, name)
            await engine.dispatch_due()  # the old backend still runs: nothing may start
            assert engine.running == 1
            await asyncio.to_thread(wait_for, lambda: engine.running == 0)
            await engine.run_due()
            await asyncio.to_thread(wait_for, lambda: engine.running == 0)

    asyncio.run(scenario())
    statuses = [h["status"] for h in app.history(name)]
    # the run in flight was put back in the queue, then the second RUN JOB ran; the fenced atomic attempt
    # rolled back
    assert statuses == ["lease_lost", "succeeded", "succeeded"]
    assert len(app.effects()) == 2
    assert app.state(name)["interval_ns"] == 2 * HOUR_NS


# -- CREATE OR REPLACE --------------------------------------------------------------------------------

def test_create_or_replace_keeps_id_owner_and_history(app: App) -> None:
    name = app.job(f"CREATE JOB app.rep {HOURLY} RUN AS {{p}} CALL app.record('a') WITH (history = 10)")
    job_id = _job_id(app, name)
    catalog.run_job(app.conn, name)
    app.run()
    catalog.execute_job_ddl(app.conn, "CREATE OR REPLACE JOB app.rep SCHEDULE CRON '*/5 * * * *' "
                                      f"RUN AS {app.principal} CALL app.record('b') WITH (time_zone = 'Europe/Berlin')")
    job = app.state(name)
    assert str(job["job_id"]) == job_id
    assert job["schedule_kind"] == "cron"
    assert (job["cron_time_zone"], job["history_limit"]) == ("Europe/Berlin", 256)  # not given: default
    assert len(app.history(name)) == 1
    # and creates when missing
    catalog.execute_job_ddl(app.conn, f"CREATE OR REPLACE JOB app.fresh {HOURLY} RUN AS {app.principal} "
                                      "CALL app.record('c')")
    assert app.state("app.fresh")["definition_version"] == 1


def test_options_at_create_and_their_errors(app: App) -> None:
    name = app.job(f"CREATE JOB app.opts {HOURLY} RUN AS {{p}} CALL app.record('x') "
                   "WITH (max_attempts = 1, history = 100000, coalesce = 'off', batch = yes)")
    job = app.state(name)
    assert (job["max_attempts"], job["history_limit"], job["coalesce_ticks"], job["batch_ticks"]) == \
        (1, 100_000, False, True)
    with pytest.raises(ParseError, match="time_zone applies to CRON schedules only"):
        app.job(f"CREATE JOB app.tz {HOURLY} RUN AS {{p}} CALL app.record('x') WITH (time_zone = 'UTC')")
    with pytest.raises(ParseError, match="given twice"):
        app.job("CREATE JOB app.tz SCHEDULE CRON '0 * * * *' TIME ZONE 'UTC' RUN AS {p} CALL app.record('x') "
                "WITH (time_zone = 'UTC')")
    with pytest.raises(ParseError, match="unknown option \"retries\""):
        app.job(f"CREATE JOB app.bad {HOURLY} RUN AS {{p}} CALL app.record('x') WITH (retries = 2)")


def test_max_attempts_bounds_retries(app: App) -> None:
    app.conn.execute(b"CREATE PROCEDURE app.conflict() LANGUAGE plpgsql AS $$ BEGIN "
                     b"RAISE EXCEPTION 'busy' USING ERRCODE = '40001'; END $$")
    name = app.job("CREATE JOB app.flaky SCHEDULE AT TIMESTAMP '2000-01-01T00:00:00Z' RUN AS {p} "
                   "CALL app.conflict() WITH (max_attempts = 2)")

    async def drain(engine: Engine) -> None:
        for _ in range(200):
            await engine.run_due()
            app.make_due(name)
            if app.state(name)["status"] == "failed":
                return
            await asyncio.sleep(0.02)

    run_engine(app.dsn, drain)
    assert [h["status"] for h in app.history(name)] == ["retrying", "failed"]


def test_coalesce_off_runs_missed_ticks_oldest_first(app: App) -> None:
    name = app.job("CREATE JOB app.catchup SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('m') "
                   "WITH (coalesce = off)")
    # three ticks were missed: move the planned tick 3 s back
    app.conn.execute("UPDATE radix.radix_system_job_state SET planned_ns = planned_ns - 3000000000, "
                     "due_ns = planned_ns - 3000000000 WHERE job_id = %s", (_job_id(app, name),))
    planned = app.state(name)["planned_ns"]
    app.run()
    first = [int(e[6].split("/")[1]) for e in app.effects()]
    assert first[0] == planned  # the oldest missed tick ran, not the latest
    assert app.state(name)["coalesced_ticks"] == 0
