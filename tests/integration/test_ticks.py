"""The one-transaction tick through the engine (sql/routines/tick.sql, engine/ticks.py): written
once, run once when two engines find it, published as a lease when it runs long, fenced by ALTER JOB,
failures and procedures that commit inside recorded on the lease path, requests queued behind it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from radixjobs import catalog
from radixjobs.engine import tick_runner
from radixjobs.engine.attempt import AttemptRunner
from radixjobs.engine.tick_runner import TickRunner
from tests.apps import App, Background, holding
from tests.support import wait_for

LOCK = 86422


@pytest.fixture
def held(app: App) -> Iterator[psycopg.Connection[Any]]:
    """The advisory lock the procedures wait on, held by a superuser session until released."""
    with holding(app, LOCK) as conn:
        yield conn


def _waits(app: App) -> None:
    app.conn.execute(f"CREATE PROCEDURE app.waits() LANGUAGE plpgsql AS $$ BEGIN "
                     f"PERFORM pg_advisory_xact_lock({LOCK}); CALL app.record('ran'); END $$".encode())


def _history_statuses(app: App, name: str) -> list[str]:
    return [h["status"] for h in app.history(name)]


def test_a_tick_writes_one_history_row_and_no_claim(app: App) -> None:
    name = app.job("CREATE JOB app.once SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('x')")
    engine = app.run()
    assert engine.counters["successes"] == 1
    (h,) = app.history(name)
    assert (h["status"], h["atomic"], h["attempt"]) == ("succeeded", True, 1)
    assert h["started_at"] <= h["finished_at"]
    state = app.state(name)
    assert state["status"] == "complete"
    row = app.conn.execute("SELECT lease_token, lease_node FROM radix.radix_system_job_state").fetchone()
    assert row == (None, None)  # never leased
    assert [e[1] for e in app.effects()] == ["x"]


def test_two_engines_run_each_tick_once(app: App) -> None:
    names = [app.job(f"CREATE JOB app.e{i} SCHEDULE EVERY INTERVAL '1 hour' RUN AS {{p}} CALL app.record('e{i}')")
             for i in range(12)]
    for name in names:
        app.make_due(name)
    with Background(app.dsn, concurrency=4, node_id="one"), Background(app.dsn, concurrency=4, node_id="two"):
        wait_for(lambda: all(_history_statuses(app, n) == ["succeeded"] for n in names), timeout=60)
    tags = sorted(e[1] for e in app.effects())
    assert tags == sorted(f"e{i}" for i in range(12))  # each tick once


def test_a_long_tick_is_published_as_a_lease_and_fenced_by_alter(app: App, held: psycopg.Connection[Any]) -> None:
    _waits(app)
    name = app.job("CREATE JOB app.long SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.waits()")
    app.make_due(name)
    with Background(app.dsn, concurrency=1, node_id="pub", lease_s=3):  # renewed (and found lost) every second
        # after a second it shows as running, leased to its node, with a running history row
        wait_for(lambda: app.state(name)["status"] == "running", timeout=60)
        assert app.state(name)["lease_node"] == "pub"
        assert _history_statuses(app, name) == ["running"]
        # ALTER JOB re-arms the job: the published lease is gone, the tick is ended and rolls back
        catalog.execute_job_ddl(app.conn, "ALTER JOB app.long SET SCHEDULE EVERY INTERVAL '2 hours'")
        with psycopg.connect(app.dsn, autocommit=True) as spy:
            wait_for(lambda: spy.execute("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
                                         "AND NOT granted", (LOCK,)).fetchone() is None, timeout=60)
    assert app.effects() == []
    assert app.state(name)["interval_ns"] == 2 * 3600 * 10**9


def test_a_published_tick_that_ends_is_recorded_once(app: App, held: psycopg.Connection[Any]) -> None:
    _waits(app)
    name = app.job("CREATE JOB app.slow SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.waits()")
    with Background(app.dsn, concurrency=1):
        wait_for(lambda: app.state(name)["status"] == "running", timeout=60)
        held.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
        wait_for(lambda: app.state(name)["status"] == "complete", timeout=60)
    (h,) = app.history(name)
    assert (h["status"], h["atomic"]) == ("succeeded", True)
    # its start is the tick's, not the publication's a second later
    assert (h["finished_at"] - h["started_at"]).total_seconds() >= 1.0
    assert [e[1] for e in app.effects()] == ["ran"]


def test_a_tick_published_before_its_query_began_runs_at_once(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend slower than PUBLISH_AFTER_S to start the tick's query (a loaded machine): the publication
    comes first, and radix.begin_tick then refuses the tick (it is a lease now). The lease is this node's:
    the tick runs on the lease path at once, instead of waiting for the lease to expire."""
    name = app.job("CREATE JOB app.once SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('once')")
    published = asyncio.Event()
    publish, run = TickRunner._publish, AttemptRunner.run

    async def publish_first(self: TickRunner, *args: Any) -> None:
        await publish(self, *args)
        published.set()

    async def run_after_publication(self: AttemptRunner, *args: Any) -> Any:
        if len(args) > 6:  # the tick's own query: sent once the publication is done
            await published.wait()
        return await run(self, *args)

    monkeypatch.setattr(tick_runner, "PUBLISH_AFTER_S", 0.0)
    monkeypatch.setattr(TickRunner, "_publish", publish_first)
    monkeypatch.setattr(AttemptRunner, "run", run_after_publication)
    engine = app.run(concurrency=1)  # the lease is 300 s: run_due returns only once the tick has run
    assert published.is_set()
    assert engine.counters["successes"] == 1
    assert [e[1] for e in app.effects()] == ["once"]
    (h,) = app.history(name)
    assert h["status"] == "succeeded"
    assert app.state(name)["status"] == "complete"


def test_a_failed_tick_is_recorded_and_retried(app: App) -> None:
    app.conn.execute("CREATE TABLE app.tries (n int); GRANT INSERT, SELECT ON app.tries TO " + app.principal)
    app.conn.execute("""CREATE PROCEDURE app.flaky() LANGUAGE plpgsql AS $$ BEGIN
        IF (SELECT count(*) FROM app.tries) = 0 THEN
            RAISE EXCEPTION 'first try fails' USING ERRCODE = '40001';
        END IF;
        CALL app.record('ok');
    END $$""")
    app.conn.execute(f"GRANT SELECT ON app.tries TO {app.principal}")
    name = app.job("CREATE JOB app.flaky SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.flaky()")
    app.run()
    (h,) = app.history(name)
    assert (h["status"], h["attempt"]) == ("retrying", 1)
    assert app.state(name)["status"] == "retry_wait"
    app.conn.execute("INSERT INTO app.tries VALUES (1)")
    app.make_due(name)
    app.run()
    assert _history_statuses(app, name) == ["retrying", "succeeded"]
    assert [h["attempt"] for h in app.history(name)] == [1, 2]
    assert [e[1] for e in app.effects()] == ["ok"]


def test_a_procedure_that_commits_inside_runs_once_on_the_lease_path(app: App) -> None:
    app.conn.execute("""CREATE PROCEDURE app.commits() LANGUAGE plpgsql AS $$ BEGIN
        CALL app.record('c'); COMMIT;
    END $$""")
    name = app.job("CREATE JOB app.commits SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.commits()")
    app.make_due(name)
    app.run()
    (h,) = app.history(name)
    assert (h["status"], h["atomic"]) == ("succeeded", False)
    assert app.state(name)["non_atomic"] is True
    assert [e[1] for e in app.effects()] == ["c"]
    # its later ticks take the lease path at once
    row = app.conn.execute("SELECT via_lease FROM radix.radix_system_job_state").fetchone()
    assert row == (True,)


def test_run_job_during_a_tick_waits_for_it(app: App, held: psycopg.Connection[Any]) -> None:
    _waits(app)
    name = app.job("CREATE JOB app.req SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.waits()")
    app.make_due(name)
    with Background(app.dsn, concurrency=1):
        with psycopg.connect(app.dsn, autocommit=True) as spy:
            wait_for(lambda: spy.execute("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
                                         "AND NOT granted", (LOCK,)).fetchone() is not None)
        catalog.run_job(app.conn, name)  # does not wait for the tick, nor roll it back
        assert app.conn.execute("SELECT count(*) FROM radix.job_requests").fetchone() == (1,)
        held.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
        wait_for(lambda: _history_statuses(app, name).count("succeeded") == 2, timeout=60)
    kinds = [h["run_kind"] for h in app.history(name)]
    assert kinds == ["schedule", "run"]
    assert [e[1] for e in app.effects()] == ["ran", "ran"]


def test_the_finder_probes_the_jobs_it_finds_and_never_reads_them_all(app: App) -> None:
    """radix.find_ticks's generic plan estimated its found set as the deal's shares times their limits and
    joined it to radix.jobs by a hash join over every job: a full scan of radix.jobs at each find (290 ms
    with 1,000,000 jobs; bench/run.py scale). Each tick found is now one probe of the jobs' primary key
    (sql/routines/finder.sql). The plan is read from auto_explain, not timed."""
    app.conn.execute("SELECT count(radix.create_job('app.c' || g, '{\"every\": \"1 hour\"}', %s, 'app.record', "
                     "'[{\"kind\": \"string\", \"value\": \"x\"}]')) FROM generate_series(1, 2000) g",
                     (app.principal,))
    app.conn.execute("UPDATE radix.radix_system_job_state SET due_ns = radix.to_ns(clock_timestamp()) "
                     "WHERE job_id IN (SELECT job_id FROM radix.jobs ORDER BY job_name LIMIT 100)")
    app.conn.execute("ANALYZE radix.jobs, radix.radix_system_job_state, radix.tick_locks")
    plans: list[str] = []
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice"):
            conn.execute(f"SET auto_explain.{setting}")
        conn.execute("SELECT radix.register_node('plan', 'localhost', 0)")
        with conn.transaction(force_rollback=True):
            found = conn.execute("SELECT * FROM radix.find_ticks('plan', 64, 0, '{}', '{}')").fetchall()
    assert len(found) == 64
    plan = "\n".join(plans)
    assert "jobs_pkey" in plan
    assert "Seq Scan on jobs" not in plan


@pytest.mark.versions
def test_the_schedulers_statements_are_never_jit_compiled(app: App) -> None:
    """On a server built with LLVM (the distributions' packages), the finder's generic plan is estimated
    past jit_above_cost, and compiling it takes far longer than running it; every radix routine with settings
    sets jit = off. With every JIT threshold at 0 in the session, no statement of the scheduler's verbs
    is compiled. The plans are read from auto_explain; a server without JIT cannot show the fault."""
    if not app.conn.execute("SELECT pg_jit_available()").fetchone()[0]:  # type: ignore[index]
        pytest.skip("this server was built without JIT (the distribution's PostgreSQL has it: .ci/run)")
    for n in range(3):
        name = app.job(f"CREATE JOB app.j{n} SCHEDULE EVERY INTERVAL '1 hour' RUN AS {{p}} CALL app.record('x')")
        app.make_due(name)
    plans: list[str] = []
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                        "auto_explain.log_level = notice", "jit = on", "jit_above_cost = 0",
                        "jit_inline_above_cost = 0", "jit_optimize_above_cost = 0"):
            conn.execute(f"SET {setting}")
        sent = ["SELECT radix.register_node('jit', 'localhost', 0)",
                "SELECT * FROM radix.find_ticks('jit', 64, 0, '{}', '{}')",
                "SELECT radix.next_due_in(4), radix.lease_work_due('jit')",
                "SELECT * FROM radix.claim_due('jit', 4, true, 4, 60, true)"]
        with conn.transaction(force_rollback=True):
            conn.execute(sent[0])
            found = conn.execute(sent[1]).fetchall()
            for statement in sent[2:]:
                conn.execute(statement)
    assert len(found) == 3
    nested = [plan for plan in plans if not any(f"Query Text: {s}" in plan for s in sent)]  # inside radix
    assert nested
    assert [plan for plan in nested if "JIT:" in plan] == []


@pytest.mark.parametrize("limit", [1, 3])
def test_a_tick_keeps_the_jobs_history_at_its_limit(app: App, limit: int) -> None:
    # end_tick writes the row, then prunes the oldest past the limit
    name = app.job(f"CREATE JOB app.kept SCHEDULE EVERY INTERVAL '1 hour' RUN AS {{p}} CALL app.record('k') "
                   f"WITH (history = {limit})")
    planned = []
    for _ in range(limit + 2):
        app.make_due(name)
        assert app.run().counters["successes"] == 1
        planned.append(app.history(name)[-1]["planned_ns"])
    rows = app.history(name)
    assert [h["status"] for h in rows] == ["succeeded"] * limit
    assert [h["planned_ns"] for h in rows] == planned[-limit:]  # the newest kept


def test_a_running_row_past_the_limit_is_closed_then_pruned(app: App) -> None:
    name = app.job("CREATE JOB app.stale SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('l') "
                   "WITH (history = 2)")
    # a row a fenced lease left 'running' (ALTER JOB during a published tick)
    app.conn.execute("INSERT INTO radix.radix_system_job_history (job_id, definition_version, planned_ns, attempt, "
                     "idempotency_key, status, node, run_kind) SELECT job_id, 1, 0, 1, 'old', 'running', 'gone', "
                     "'schedule' FROM radix.job_overview WHERE name = %s", (name,))
    app.make_due(name)
    app.run()
    assert [h["status"] for h in app.history(name)] == ["lease_lost", "succeeded"]
    for _ in range(2):
        app.make_due(name)
        app.run()
    assert [h["status"] for h in app.history(name)] == ["succeeded", "succeeded"]


def test_the_hot_paths_rules_are_inlined_into_their_callers(app: App) -> None:
    """Each rule the tick's statements use (docs/hot-path.md) is a SQL function the planner inlines: EXPLAIN
    VERBOSE of a statement calling it shows its expression, not a call (an IMMUTABLE function whose body is
    only STABLE, as extract() of a timestamptz is, would be called once per row instead)."""
    shown = "\n".join(r[0] for r in app.conn.execute(
        "EXPLAIN VERBOSE SELECT radix.to_ns(clock_timestamp()), "
        "radix._mac_of(radix._session_key_of(k.secret, pg_backend_pid(), now()), "
        "radix._token_of(k.secret, gen_random_uuid(), 1, 0, now())), radix._tick_frame_mac_of(k.secret, 'x') "
        "FROM radix.attempt_secret k").fetchall())
    assert "radix." not in shown.replace("radix.attempt_secret", "").replace("'radix.tick/", ""), shown
    # the same value as extract(epoch FROM t), whatever the session's time zone
    app.conn.execute("SET TimeZone = 'America/St_Johns'")
    assert app.conn.execute(
        "SELECT count(*) FROM (SELECT clock_timestamp() + g * interval '11 hours 7 minutes 3.123457 seconds' AS t "
        "FROM generate_series(-150000, 150000, 7) g) s "
        "WHERE radix.to_ns(t) <> (extract(epoch FROM t) * 1000000000)::bigint").fetchone() == (0,)
