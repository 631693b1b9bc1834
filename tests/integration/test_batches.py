"""Tick batches through the engine (sql/routines/batch.sql, engine/batches.py): a backlog of
short ticks of one principal, owner and procedure runs in batches, each tick once; a tick that fails fails
alone, a procedure that commits inside is run non-atomically, a batch that times out runs its ticks alone,
and recurring ticks of a batch each advance to their own next tick, each job's history kept at its limit."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg import sql

from radixjobs.engine.attempt import AttemptRunner
from tests.apps import App, run_engine
from tests.support import wait_for

pytestmark = pytest.mark.versions

MAYBE = """
CREATE PROCEDURE app.maybe(tag text) LANGUAGE plpgsql AS $$
BEGIN
  IF tag = 'bad' THEN RAISE EXCEPTION 'bad tick %', tag; END IF;
  IF tag = 'slow' THEN PERFORM pg_sleep(3); END IF;
  IF tag = 'commits' THEN COMMIT; END IF;
  CALL app.record(tag);
END $$
"""


pytestmark = pytest.mark.usefixtures("batchable")  # batches form whatever the machine's load


def _jobs(app: App, tags: list[str], options: str = "batch = on") -> list[str]:
    """One due job per tag WITH (``options``), each calling app.maybe(tag), after a job 'lead' due before them:
    the lead runs alone (its procedure's duration is not known yet), and the others then form batches."""
    app.conn.execute(MAYBE.encode())
    return [app.job(f"CREATE JOB app.j{i} SCHEDULE AT TIMESTAMP '{2019 if i == 0 else 2020}-01-01' RUN AS {{p}} "
                    f"CALL app.maybe('{tag}') WITH ({options})") for i, tag in enumerate(["lead", *tags])]


def _run(app: App, **kwargs: Any) -> Any:
    return run_engine(app.dsn, lambda e: e.run_due(), concurrency=1, **kwargs)


def _started(app: App) -> list[Any]:
    """The history rows' started_at: a tick's transaction start, the same for every tick of a batch."""
    return [r[0] for r in app.conn.execute("SELECT started_at FROM radix.radix_system_job_history "
                                           "WHERE status = 'succeeded' ORDER BY started_at").fetchall()]


def test_a_backlog_runs_in_batches_each_tick_once(app: App) -> None:
    tags = [f"t{i}" for i in range(40)]
    names = _jobs(app, tags)
    engine = _run(app)
    assert engine.counters["successes"] == 41
    assert engine.counters["batched_ticks"] == 40  # 32 + 8, after the lead ran alone
    assert sorted(e[1] for e in app.effects()) == sorted(["lead", *tags])  # each once
    assert all([h["status"] for h in app.history(n)] == ["succeeded"] for n in names)
    started = _started(app)
    assert sorted(started.count(s) for s in set(started)) == [1, 8, 32]
    # each tick's frame (radix.current_*(), read by app.record) is its own, in a batch as alone (a
    # batched tick's frame is a setting with a MAC, not a row)
    effects = {e[1]: e for e in app.effects()}
    for tag, name in zip(["lead", *tags], names, strict=True):
        state = app.state(name)
        job, attempt, key = effects[tag][4:7]
        assert (job, attempt, key) == (state["job_id"], 1, f"{state['job_id']}/{state['planned_ns']}")
    assert {e[2] for e in app.effects()} == {app.principal}  # who: each tick as its principal


def test_one_batch_at_most_with_tick_batch_1(app: App) -> None:
    _jobs(app, [f"t{i}" for i in range(5)])
    engine = _run(app, tick_batch=1)
    assert (engine.counters["successes"], engine.counters["batched_ticks"]) == (6, 0)
    assert len(set(_started(app))) == 6


def test_a_failing_tick_fails_alone_and_the_batch_commits(app: App) -> None:
    names = _jobs(app, ["a", "bad", "b", "c"])
    engine = _run(app)
    assert engine.counters["batched_ticks"] == 4
    assert sorted(e[1] for e in app.effects()) == ["a", "b", "c", "lead"]
    [bad] = app.history(names[2])
    assert bad["status"] == "failed"  # RAISE: not retried
    assert "bad tick bad" in bad["error"]["message"]
    assert [h["status"] for h in app.history(names[3])] == ["succeeded"]


def test_a_procedure_that_commits_inside_a_batch_runs_non_atomically(app: App) -> None:
    names = _jobs(app, ["a", "commits", "b"])
    engine = _run(app)
    assert engine.counters["batched_ticks"] == 3
    assert sorted(e[1] for e in app.effects()) == ["a", "b", "commits", "lead"]
    [run] = app.history(names[2])
    assert (run["status"], run["atomic"]) == ("succeeded", False)
    assert app.state(names[2])["non_atomic"] is True


def test_a_batch_that_times_out_runs_its_ticks_alone(app: App) -> None:
    names = _jobs(app, ["a", "slow", "b"], "batch = on, timeout = '1 second'")
    engine = _run(app)
    assert engine.counters["batched_ticks"] == 3
    # the batch was cancelled whole: nothing of it committed; then each tick ran alone
    assert sorted(e[1] for e in app.effects()) == ["a", "b", "lead"]
    [slow] = app.history(names[2])
    assert slow["status"] == "retrying"
    assert slow["error"]["category"] == "deadline"
    assert len(set(_started(app))) == 3  # the lead, a and b: each in its own transaction


def test_recurring_ticks_in_a_batch_advance_to_their_next_tick(app: App) -> None:
    # radix.end_ticks advances every state of the batch in one UPDATE: each to its own next tick
    app.conn.execute(MAYBE.encode())
    names = [app.job(f"CREATE JOB app.r{i} SCHEDULE EVERY INTERVAL '{i + 1} hour' RUN AS {{p}} "
                     f"CALL app.maybe('r{i}') WITH (batch = on)") for i in range(6)]
    before = {n: app.state(n)["planned_ns"] for n in names}
    for name in names:
        app.make_due(name)
    engine = _run(app)
    assert engine.counters["successes"] == 6
    assert engine.counters["batched_ticks"] >= 2
    assert len(set(_started(app))) < 6  # some ran together
    for i, name in enumerate(names):
        state = app.state(name)
        assert (state["status"], state["attempt"]) == ("scheduled", 0)
        assert state["planned_ns"] == before[name] + (i + 1) * 3_600_000_000_000
        (h,) = app.history(name)
        assert (h["status"], h["planned_ns"], h["attempt"], h["atomic"]) == ("succeeded", before[name], 1, True)


def test_ticks_in_batches_keep_each_jobs_history_at_its_limit(app: App) -> None:
    app.conn.execute(MAYBE.encode())
    names = [app.job(f"CREATE JOB app.h{i} SCHEDULE EVERY INTERVAL '1 hour' RUN AS {{p}} CALL app.maybe('h{i}') "
                     f"WITH (history = 2, batch = on)") for i in range(5)]
    batched = 0
    planned: dict[str, list[int]] = {n: [] for n in names}
    for _ in range(4):
        for name in names:
            planned[name].append(app.state(name)["planned_ns"])
            app.make_due(name)
        batched += _run(app).counters["batched_ticks"]
    assert batched >= 8  # most rounds ran in batches
    for name in names:
        assert [h["planned_ns"] for h in app.history(name)] == planned[name][-2:]  # the newest two


@pytest.mark.parametrize("tags", [["bad", "bad"], ["a", "bad"], ["bad", "a"]])
def test_a_batch_leaves_no_frame_whichever_of_its_ticks_fail(app: App, tags: list[str]) -> None:
    # each tick's frame is written in the batch's own transaction (radix.start_tick): radix.end_ticks removes
    # the last one, also when its tick's CALL failed, so that no frame of a tick outlives the batch
    _jobs(app, tags)
    engine = _run(app)
    assert engine.counters["batched_ticks"] == 2
    assert app.conn.execute("SELECT count(*) FROM radix.attempt_frames").fetchone() == (0,)


def test_no_routine_on_the_ticks_path_is_planned_at_every_call(app: App) -> None:
    """Before PostgreSQL 18 a SQL-language routine that is not inlined parses and plans its body at every
    call (the routines' plan_cache_mode). With track_functions on for the engine's sessions, a lone tick, a batch and
    the finds around them call radix routines, none of them such a SQL-language one."""
    app.conn.execute(sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(
        sql.Identifier(app.conn.info.dbname)))
    _jobs(app, [f"t{i}" for i in range(4)])
    engine = _run(app)
    assert (engine.counters["successes"], engine.counters["batched_ticks"]) == (5, 4)
    called = """
        SELECT f.schemaname || '.' || f.funcname, l.lanname, p.proconfig IS NOT NULL
        FROM pg_stat_user_functions f JOIN pg_proc p ON p.oid = f.funcid JOIN pg_language l ON l.oid = p.prolang
        WHERE f.schemaname = 'radix'
    """

    def flushed() -> list[Any] | None:  # the engine's sessions have ended; their counts arrive soon after
        app.conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = app.conn.execute(called).fetchall()
        names = {r[0] for r in rows}
        return rows if {"radix.find_ticks", "radix.start_tick", "radix.start_ticks", "radix.current_job_id",
                        "radix._frame", "radix._prune_history"} <= names else None

    rows = wait_for(flushed)
    assert [name for name, language, settings in rows if language == "sql" and settings] == []


async def test_a_connection_whose_batch_was_being_cancelled_is_not_used_again(app: App) -> None:
    """The watchdog's cancel of a batch past its limit can reach the backend after the batch ended on its own
    (its statement timeout, at the same moment), and would cancel the next query sent there (a tick of that
    batch run alone, which then failed as cancelled): such a connection is closed, never reused."""
    terminated: list[int] = []

    async def terminate(pid: int) -> None:
        terminated.append(pid)

    runner = AttemptRunner(terminate, grace_s=5.0)
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
        outcome, cur = await runner.run_batch(conn, b"SELECT pg_catalog.pg_sleep(2)", 0.05, asyncio.Event())
        assert (outcome.succeeded, cur) == (False, None)
        assert conn.closed
    runner.close()
    assert terminated == []  # closed, not left to the watchdog's termination
