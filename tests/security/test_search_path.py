"""Objects other roles create are never chosen by a statement radixjobs sends (issue: hostile tenants 1, 2, 12).

- The scheduler's own connections (CLI, migrations, engine, daemon, document scheduler) pin search_path to
  ``pg_catalog, pg_temp``: tested with the red team's two shadows (``public./(bigint, numeric)`` and
  ``"$user".pg_terminate_backend(smallint)``, each making the attacker SUPERUSER if called), and with the
  worst case — the scheduler role's own default search_path put behind a schema that shadows every
  pg_catalog function, operator and aggregate (tests/security/shadows.py).
- On a principal's connection (the principal's search_path, the principal's settings) every statement
  radixjobs sends is qualified: a principal that shadows all of pg_catalog in ``mine, pg_catalog`` sees none
  of its shadows called by the clean, the frame, the INTERVAL evaluation or the DB_FUNCTION lookup.
- The clean between attempts is bounded: held up by a lock, the connection is dropped, not waited for.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from radixjobs import documents
from radixjobs.engine import Engine
from tests.acceptance.serving import Serve
from tests.apps import App, run_engine
from tests.security.shadows import hits, install_shadows
from tests.support import document_engine, wait_for

FIRST_RUN = "2020-01-01T00:00:00"


def _cli(dsn: str, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PG") and k not in ("RADIXJOBS_DSN", "RADIXJOBS_HOME")}
    done = subprocess.run([sys.executable, "-m", "radixjobs", "--dsn", dsn, "--json", *args],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, f"{args}: {done.stderr}"
    return json.loads(done.stdout) if done.stdout.strip() else None


def _exec(conn: psycopg.Connection[Any], template: str, *names: str) -> None:
    conn.execute(sql.SQL(template).format(*(sql.Identifier(n) for n in names)))  # type: ignore[arg-type]


def _workload(app: App) -> None:
    """Jobs of every kind (EVERY, CRON, one that commits inside, one past its deadline) and a document."""
    app.conn.execute("""
        CREATE PROCEDURE app.record_commit(tag text) LANGUAGE plpgsql AS $$
        BEGIN CALL app.record(tag); COMMIT; END $$;
        CREATE PROCEDURE app.stubborn() LANGUAGE plpgsql AS $$
        BEGIN
          LOOP BEGIN PERFORM pg_catalog.pg_sleep(30); EXCEPTION WHEN query_canceled THEN NULL; END; END LOOP;
        END $$;
        CREATE FUNCTION app.doc_fn() RETURNS void LANGUAGE plpgsql AS $$
        BEGIN CALL app.record('doc'); END $$;
    """)
    _exec(app.conn, "GRANT EXECUTE ON FUNCTION app.doc_fn() TO {}", app.principal)
    app.job("CREATE JOB app.every SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('every')")
    app.job("CREATE JOB app.commits SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record_commit('c')")
    app.job("CREATE JOB app.cron SCHEDULE CRON '* * * * *' RUN AS {p} CALL app.record('cron')")
    documents.apply(app.conn, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
        "NUM": 501, "DB_FUNCTION": "app.doc_fn", "RUN_AS": app.principal, "FIRST_RUN": FIRST_RUN,
        "INTERVAL": "date_trunc('hour', NOW()) + INTERVAL '1 hour'"}})


def _tags(app: App) -> dict[str, int]:
    rows = app.conn.execute("SELECT tag, count(*) FROM app.effects GROUP BY tag").fetchall()
    return {tag: int(n) for tag, n in rows}


def _doc_runs(app: App) -> list[tuple[str, str | None]]:
    return app.conn.execute("SELECT status, error_text FROM radix.sys_processes WHERE task_num = '501' "
                            "ORDER BY id").fetchall()


def test_scheduler_role_default_search_path_chooses_nothing(app: App, roles: Any, tmp_path: Path) -> None:
    """Worst case: the scheduler role's default search_path is ``evil, pg_catalog``, and ``evil`` shadows
    every pg_catalog function, operator and aggregate. Every command and the daemon still call none."""
    attacker = roles("attacker")
    assert install_shadows(app.conn, "evil", attacker) > 2000
    _workload(app)
    scheduler = app.conn.info.user
    dbname = app.conn.info.dbname
    _exec(app.conn, "ALTER ROLE {} IN DATABASE {} SET search_path = evil, pg_catalog", scheduler, dbname)

    _cli(app.dsn, "install")
    listed = _cli(app.dsn, "jobs", "list")
    assert {"app.every", "app.commits", "app.cron", "doc:501"} <= {j["name"] for j in listed}
    _cli(app.dsn, "jobs", "show", "app.every")
    _cli(app.dsn, "jobs", "next", "app.cron")
    _cli(app.dsn, "docs", "list")
    _cli(app.dsn, "docs", "show", "501")
    assert _cli(app.dsn, "run", "--once")["attempts"] >= 2  # every, commits (cron: when a minute began)
    assert _cli(app.dsn, "docs", "run", "--once")["runs"] == 1
    _cli(app.dsn, "jobs", "history", "app.every")
    tags = _tags(app)  # on a loaded machine, a 1-second job may come due again within run --once
    assert tags.get("every", 0) >= 1
    assert tags.get("c", 0) >= 1
    assert tags.get("doc") == 1
    assert _doc_runs(app)[-1][1] is None, _doc_runs(app)

    # a job past its deadline: its backend is ended from the scheduler's own connection
    app.job("CREATE JOB app.stubborn SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.stubborn()")
    app.conn.execute("UPDATE radix.jobs SET deadline_ms = 200 WHERE job_name = 'stubborn'")
    app.make_due("app.stubborn")
    engine = run_engine(app.dsn, lambda e: e.run_due(), grace_s=0.2)
    assert engine.counters["terminations"] >= 1
    app.conn.execute("SELECT radix.drop_job('app.stubborn')")

    node = Serve(tmp_path, "--dsn", app.dsn)
    try:
        before = _tags(app).get("every", 0)
        wait_for(lambda: _tags(app).get("every", 0) >= before + 2, timeout=60, message="daemon runs")
        assert node.status()["databases"]
    finally:
        node.stop()
    assert hits(app.conn, "evil") == (0, [])


def test_red_team_shadows_in_public_and_dollar_user_never_run(app: App, roles: Any, tmp_path: Path) -> None:
    """``public./(bigint, numeric)`` (the next wake-up) and ``"$user".pg_terminate_backend(smallint)`` (the
    deadline) were exact matches where pg_catalog needed a cast: each would make the attacker SUPERUSER."""
    attacker = roles("attacker")
    scheduler = app.conn.info.user
    _exec(app.conn, "GRANT CREATE ON SCHEMA public TO {}", attacker)
    _exec(app.conn, "CREATE SCHEMA {} AUTHORIZATION {}", scheduler, attacker)
    _exec(app.conn, "SET ROLE {}", attacker)
    escalate = sql.SQL("ALTER ROLE {} SUPERUSER").format(sql.Identifier(attacker)).as_string(app.conn)
    app.conn.execute(sql.SQL("""
        CREATE FUNCTION public.div(bigint, numeric) RETURNS numeric LANGUAGE plpgsql AS $$
        BEGIN EXECUTE {e}; RETURN $1::numeric / $2; END $$;
        CREATE OPERATOR public./ (LEFTARG = bigint, RIGHTARG = numeric, FUNCTION = public.div);
        CREATE FUNCTION {s}.pg_terminate_backend(smallint) RETURNS boolean LANGUAGE plpgsql AS $$
        BEGIN EXECUTE {e}; RETURN pg_catalog.pg_terminate_backend($1::int); END $$;
    """).format(e=sql.Literal(escalate), s=sql.Identifier(scheduler)))
    app.conn.execute("RESET ROLE")
    app.conn.execute("""
        CREATE PROCEDURE app.stubborn() LANGUAGE plpgsql AS $$
        BEGIN
          LOOP BEGIN PERFORM pg_catalog.pg_sleep(30); EXCEPTION WHEN query_canceled THEN NULL; END; END LOOP;
        END $$""")
    app.job("CREATE JOB app.stubborn SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.stubborn()")
    app.job("CREATE JOB app.every SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('every')")
    app.conn.execute("UPDATE radix.jobs SET deadline_ms = 200 WHERE job_name = 'stubborn'")
    app.make_due("app.stubborn")

    async def until_both_ran(engine: Engine) -> None:
        deadline = time.monotonic() + 120
        while engine.counters["terminations"] < 1 or _tags(app).get("every", 0) < 2:
            assert time.monotonic() < deadline, (engine.counters["terminations"], _tags(app))
            await engine.run_for(0.5, poll_s=0.2)

    run_engine(app.dsn, until_both_ran, grace_s=0.2)  # the stubborn attempt terminated, the 1 s job ran on
    node = Serve(tmp_path, "--dsn", app.dsn)
    try:
        before = _tags(app).get("every", 0)
        wait_for(lambda: _tags(app).get("every", 0) >= before + 2, timeout=60, message="daemon runs")
    finally:
        node.stop()
    row = app.conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (attacker,)).fetchone()
    assert row == (False,)


def test_principal_search_path_shadows_are_never_called(app: App, conn: psycopg.Connection[Any]) -> None:
    """The principal sets ``search_path = mine, pg_catalog`` and shadows all of pg_catalog in ``mine``:
    the clean (run twice on one connection), the atomic and non-atomic frames, the INTERVAL evaluation and
    the DB_FUNCTION lookup call none of them, and everything still runs."""
    _exec(conn, "GRANT CREATE ON DATABASE {} TO {}", conn.info.dbname, app.principal)
    install_shadows(conn, "mine", app.principal)
    _workload(app)
    _exec(conn, "ALTER ROLE {} SET search_path = mine, pg_catalog", app.principal)
    try:
        for _ in range(2):
            app.make_due("app.every")
            app.make_due("app.commits")
            run_engine(app.dsn, lambda e: e.run_due(), concurrency=1)

        async def documents_once() -> None:
            async with document_engine(app.dsn, concurrency=1) as scheduler:
                await scheduler.run_due()

        asyncio.run(documents_once())
    finally:
        _exec(conn, "ALTER ROLE {} RESET search_path", app.principal)
    assert hits(conn, "mine") == (0, [])
    assert _tags(app) == {"every": 2, "c": 2, "doc": 1}
    assert [s for s, _ in _doc_runs(app)] == ["completed"], _doc_runs(app)
    due = conn.execute("SELECT (props->>'NEXT_RUN') FROM radix.cron_table WHERE num = '501'").fetchone()
    assert due is not None


def test_a_clean_held_up_by_a_lock_drops_the_connection(app: App, conn: psycopg.Connection[Any]) -> None:
    """A procedure leaves a temp table inheriting from its own table; another session of the principal then
    locks that table (LOCK recurses to every child, the temp one too), so the clean's DISCARD TEMP would wait
    for it forever. The clean gives up within its bound, the connection is closed (never reused), and the
    next attempt runs."""
    conn.execute("CREATE TABLE app.parent (x int)")
    _exec(conn, "ALTER TABLE app.parent OWNER TO {}", app.principal)
    conn.execute("""
        CREATE PROCEDURE app.leave_temp() LANGUAGE plpgsql AS $$
        BEGIN
          CREATE TEMP TABLE leftover () INHERITS (app.parent);
          COMMIT;  -- app.parent is free again; leftover stays until the clean
          PERFORM pg_catalog.pg_advisory_xact_lock(4242);  -- the test's gate
          CALL app.record('temp');
        END $$""")
    app.job("CREATE JOB app.temp SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.leave_temp()")
    app.make_due("app.temp")
    holder_dsn = psycopg.conninfo.make_conninfo(app.dsn, user=app.principal)

    def at_gate() -> bool:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND usename = %s", (app.principal,)).fetchone()
        return bool(row and row[0])

    async def until(predicate: Any) -> None:
        """Poll a database condition (another session's lock wait: no event to await)."""
        async with asyncio.timeout(120):
            while not predicate():  # noqa: ASYNC110
                await asyncio.sleep(0.01)

    async def go() -> tuple[float, int]:
        gate = await psycopg.AsyncConnection.connect(app.dsn, autocommit=True)
        holder = await psycopg.AsyncConnection.connect(holder_dsn)
        try:
            await gate.execute("SELECT pg_catalog.pg_advisory_lock(4242)")
            async with Engine(app.dsn, concurrency=1) as engine:
                run = asyncio.create_task(engine.run_due())
                await until(at_gate)
                await holder.execute("LOCK app.parent IN ACCESS EXCLUSIVE MODE")  # and leftover with it
                await gate.execute("SELECT pg_catalog.pg_advisory_unlock(4242)")
                started = time.monotonic()
                await asyncio.wait_for(run, 120)  # the table stays locked: a clean that waited for ever fails here
                elapsed = time.monotonic() - started
                idle = len(engine._principals._idle.get(app.principal, []))
                app.job("CREATE JOB app.next SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('next')")
                app.make_due("app.next")
                await engine.run_due()
                return elapsed, idle
        finally:
            await holder.close()
            await gate.close()

    elapsed, idle = asyncio.run(go())
    assert idle == 0
    assert elapsed > 4  # held up, then given up at CLEAN_TIMEOUT_S (5 s), and the connection closed
    assert _tags(app) == {"temp": 1, "next": 1}


def test_the_random_seed_does_not_survive_the_clean(app: App) -> None:
    """A job that seeds the PRNG cannot make the next job of the same principal draw known numbers."""
    app.conn.execute("""
        CREATE PROCEDURE app.seed() LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_catalog.setseed(0.25); END $$;
        CREATE PROCEDURE app.draw() LANGUAGE plpgsql AS $$
        BEGIN CALL app.record(pg_catalog.random()::text); END $$""")
    app.job("CREATE JOB app.a_seed SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.seed()")
    app.job("CREATE JOB app.b_draw SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.draw()")
    for name, due in (("a_seed", "2000-01-01"), ("b_draw", "2000-01-02")):  # seed first, then draw
        app.conn.execute("UPDATE radix.radix_system_job_state s SET due_ns = radix.to_ns(%s::timestamptz) "
                         "FROM radix.jobs j WHERE j.job_id = s.job_id AND j.job_name = %s", (due, name))
    run_engine(app.dsn, lambda e: e.run_due(), concurrency=1)
    app.conn.execute("SELECT pg_catalog.setseed(0.25)")
    expected = app.conn.execute("SELECT pg_catalog.random()::text").fetchone()
    drawn = app.conn.execute("SELECT tag FROM app.effects").fetchone()
    assert drawn is not None
    assert drawn != expected
