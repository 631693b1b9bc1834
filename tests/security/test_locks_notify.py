"""Locks and notifications (issue #11, items 5 and 6), attacked through the real paths.

Locks: any role can hold an advisory key, and any role with USAGE on schema radix can hold TABLE locks on
its tables (PREPARE and CREATE TEMP VIEW lock without a privilege). Admission, document applies, installs,
``jobs list`` and ``run --once`` must not wait on either; what they may wait on (a row lock taken by
someone who passed the same checks) is bounded and ends in a one-line error.

Notifications: a LISTENing session that stays in a transaction stops the cluster's NOTIFY queue from
draining; once it is full, every notifying COMMIT fails. A small separate server (max_notify_queue_pages
at its minimum) is filled for real; writes and scheduling must go on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from radixjobs import catalog, documents, migrate
from radixjobs.documents import Documents
from radixjobs.embedded import EmbeddedServer
from radixjobs.engine import Engine
from radixjobs.errors import AdmissionError
from tests.acceptance.conftest import run_cli
from tests.acceptance.serving import Serve
from tests.apps import App, make_app
from tests.integration.test_documents import eventually
from tests.support import PgCluster, wait_for

GUARD = "-c statement_timeout=20s"  # a regression fails the test instead of hanging it


def _as(dsn: str, user: str, *, autocommit: bool = True, options: str = GUARD) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, user=user, autocommit=autocommit, options=options)


def _document(num: int, principal: str, function: str = "app.touch", status: str = "CRON_TABLE_PASSIVE"
              ) -> dict[str, Any]:
    return {"dockind": "CRON_TABLE", "status": status,
            "props": {"NUM": num, "DB_FUNCTION": function, "RUN_AS": principal,
                      "INTERVAL": "NOW() + INTERVAL '1 hour'", "FIRST_RUN": "2025-01-01T00:00:00"}}


def _prepare_victim(app: App) -> None:
    """The principal may create jobs in app; app.touch() records a document run."""
    app.conn.execute(sql.SQL("GRANT CREATE ON SCHEMA app TO {}").format(sql.Identifier(app.principal)))
    app.conn.execute("CREATE FUNCTION app.touch() RETURNS void LANGUAGE sql "
                     "AS $$ INSERT INTO app.effects (tag) VALUES ('doc') $$")


# -- locks --------------------------------------------------------------------------------------------------
def test_advisory_keys_any_role_holds_block_nothing(app: App, roles: Any) -> None:
    _prepare_victim(app)
    attacker = roles("mallory")
    with _as(app.dsn, attacker) as evil:
        evil.execute("SELECT pg_advisory_lock(hashtext('radix.job:app.victim')), "
                     "pg_advisory_lock(hashtext('radix.doc:7')), pg_advisory_lock(%s)",
                     (migrate.MIGRATION_LOCK_KEY,))
        # the keys stay held throughout: a wait on one could only end in an error (the 5 s bound on lock
        # waits, or GUARD's statement timeout), so each success says nothing waited for them
        with _as(app.dsn, app.principal) as victim:
            catalog.execute_job_ddl(victim, f"CREATE JOB app.victim SCHEDULE EVERY INTERVAL '1 hour' "
                                            f"RUN AS {app.principal} CALL app.record('victim')")
            documents.apply(victim, _document(7, app.principal))
        for command in (("jobs", "list"), ("install",), ("run", "--once")):
            done = run_cli(*command, "--dsn", app.dsn, timeout=60)
            assert done.returncode == 0, (command, done.stderr)
            if command == ("jobs", "list"):
                assert "app.victim" in done.stdout
                assert "doc:7" in done.stdout


def test_table_locks_any_role_can_take_block_nothing(app: App, roles: Any) -> None:
    _prepare_victim(app)
    attacker = roles("mallory")
    tables = ("migration_lock", "schema_migrations", "name_locks", "jobs", "radix_system_job_state", "cron_table")
    with _as(app.dsn, attacker, autocommit=False) as evil:
        for n, table in enumerate(tables):  # no privilege needed: the lock is taken before the check
            evil.execute(sql.SQL("PREPARE p{} AS DELETE FROM radix.{}").format(sql.SQL(str(n)), sql.Identifier(table)))
        evil.execute("CREATE TEMP VIEW v AS SELECT job_id FROM radix.jobs")
        # and the views and functions an install would replace (an up-to-date install replaces nothing)
        evil.execute("PREPARE pv AS SELECT * FROM radix.job_overview, radix.node_overview")
        held = app.conn.execute("SELECT count(DISTINCT relation) FROM pg_locks WHERE pid = %s AND relation IN "
                                "(SELECT oid FROM pg_class WHERE relnamespace = 'radix'::regnamespace)",
                                (evil.info.backend_pid,)).fetchone()
        assert held
        assert held[0] >= len(tables)
        with _as(app.dsn, app.principal) as victim:
            catalog.execute_job_ddl(victim, f"CREATE JOB app.victim SCHEDULE EVERY INTERVAL '1 hour' "
                                            f"RUN AS {app.principal} CALL app.record('victim')")
            assert catalog.alter_job(victim, "app.victim", enabled=False)
            documents.apply(victim, _document(7, app.principal))
        for command in (("install",), ("jobs", "list"), ("run", "--once")):
            done = run_cli(*command, "--dsn", app.dsn, timeout=60)
            assert done.returncode == 0, (command, done.stderr)


def test_the_daemon_starts_and_schedules_while_keys_and_tables_are_held(app: App, roles: Any,
                                                                       tmp_path: Path) -> None:
    _prepare_victim(app)
    attacker = roles("mallory")
    with _as(app.dsn, attacker, autocommit=False) as evil:
        evil.execute("SELECT pg_advisory_lock(hashtext('radix.job:app.victim')), "
                     "pg_advisory_lock(hashtext('radix.doc:3')), pg_advisory_lock(%s)", (migrate.MIGRATION_LOCK_KEY,))
        for n, table in enumerate(("nodes", "jobs", "radix_system_job_state", "cron_table", "sys_processes")):
            evil.execute(sql.SQL("PREPARE p{} AS DELETE FROM radix.{}").format(sql.SQL(str(n)), sql.Identifier(table)))
        serve = Serve(tmp_path, "--dsn", app.dsn, "--poll", "0.2")
        try:
            with _as(app.dsn, app.principal) as victim:
                catalog.execute_job_ddl(victim, f"CREATE JOB app.victim SCHEDULE EVERY INTERVAL '1 second' "
                                                f"RUN AS {app.principal} CALL app.record('victim')")
                documents.apply(victim, _document(3, app.principal, status="CRON_TABLE_ACTIVE"))
            wait_for(lambda: {"victim", "doc"} <= _tags(app), timeout=60, message="the job and the document to run")
        finally:
            serve.stop()


def _tags(app: App) -> set[str]:
    return {row[0] for row in app.conn.execute("SELECT tag FROM app.effects").fetchall()}


def test_a_held_job_name_is_a_bounded_wait_with_a_clear_error(app: App, roles: Any) -> None:
    _prepare_victim(app)
    with _as(app.dsn, app.principal, autocommit=False) as first:  # creating it, not yet committed
        first.execute("SELECT 1")  # a transaction is open: the DDL below runs in a savepoint of it
        catalog.execute_job_ddl(first, f"CREATE JOB app.contested SCHEDULE EVERY INTERVAL '1 hour' "
                                       f"RUN AS {app.principal} CALL app.record('x')")
        with _as(app.dsn, app.principal, options=f"{GUARD} -c lock_timeout=300ms") as second:
            with pytest.raises(AdmissionError) as caught:
                catalog.execute_job_ddl(second, f"CREATE JOB app.contested SCHEDULE EVERY INTERVAL '1 hour' "
                                                f"RUN AS {app.principal} CALL app.record('y')")
            assert caught.value.code == "55P03"
            assert "job app.contested is being created or changed by another transaction; try again" in str(
                caught.value)
            assert "\n" not in str(caught.value)
            # the caller's lock_timeout is restored after admission
            assert second.execute("SHOW lock_timeout").fetchone() == ("300ms",)


def test_a_held_document_is_bounded_even_without_a_lock_timeout(app: App) -> None:
    _prepare_victim(app)
    with _as(app.dsn, app.principal) as owner:
        documents.apply(owner, _document(9, app.principal))
    with _as(app.dsn, app.principal, autocommit=False) as holder:
        active = _document(9, app.principal, status="CRON_TABLE_ACTIVE")
        holder.execute("SELECT radix.apply_document(%s)", (Jsonb(active),))
        with _as(app.dsn, app.principal) as other:  # lock_timeout 0: the 5 s bound of admission applies
            started = time.monotonic()
            # ended by that bound (55P03), not by GUARD's statement timeout (57014) nor waiting for ever
            with pytest.raises(psycopg.errors.LockNotAvailable, match="CRON_TABLE task 9 is being created or "
                                                                       "changed by another transaction"):
                other.execute("SELECT radix.apply_document(%s)", (Jsonb(_document(9, app.principal)),))
            assert time.monotonic() - started > 4.0  # it did wait, for the bound


def test_concurrent_installs_serialise_on_the_row(empty_db: str) -> None:
    """Without the advisory key, first installs race on creating schema radix: one wins, the rest retry."""
    outcomes: list[object] = []

    def install() -> None:
        try:
            with psycopg.connect(empty_db, autocommit=True) as c:
                outcomes.append(len(migrate.install(c)))
        except Exception as exc:  # reported by the assertion below
            outcomes.append(exc)

    threads = [threading.Thread(target=install) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes, key=str) == [0, 0, 0, len(migrate.migrations())]


def test_an_install_waiting_too_long_fails_in_one_line(app: App) -> None:
    with psycopg.connect(app.dsn) as other_install:  # another install in progress holds the row
        other_install.execute("SELECT FROM radix.migration_lock FOR UPDATE")
        done = run_cli("install", "--dsn", app.dsn, env={"RADIXJOBS_LOCK_TIMEOUT": "0.5"}, timeout=60)
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("radixjobs: error: install waited more than 0.5s for a lock")
        assert f"pid {other_install.info.backend_pid}" in lines[0]
    bad = run_cli("install", "--dsn", app.dsn, env={"RADIXJOBS_LOCK_TIMEOUT": "soon"}, timeout=60)
    assert bad.returncode == 1
    assert bad.stderr.strip() == ("radixjobs: error: RADIXJOBS_LOCK_TIMEOUT must be a number of seconds in "
                                  "(0, 3600], got 'soon'")


def test_the_scheduler_s_own_connections_bound_lock_waits(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXJOBS_LOCK_TIMEOUT", "1.5")

    async def go() -> list[Any]:
        seen = []
        async with Engine(app.dsn, node_id="bounded") as engine:
            async with engine._pool.connection() as conn:
                seen.append(await (await conn.execute("SHOW lock_timeout")).fetchone())
            assert engine._control is not None
            seen.append(await (await engine._control.execute("SHOW lock_timeout")).fetchone())
        return seen

    assert asyncio.run(go()) == [("1500ms",)] * 2  # the documents run on the engine's pool


def test_the_engine_s_wait_on_a_row_its_owner_holds_is_bounded(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's owner locks its state row (ALTER JOB in an open transaction) while an attempt of it is
    being finalised: the engine gives up after RADIXJOBS_LOCK_TIMEOUT instead of waiting for ever."""
    monkeypatch.setenv("RADIXJOBS_LOCK_TIMEOUT", "0.5")
    _prepare_victim(app)
    app.conn.execute("CREATE PROCEDURE app.fails() LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'no'; END $$")
    with _as(app.dsn, app.principal) as owner:
        catalog.execute_job_ddl(owner, f"CREATE JOB app.own SCHEDULE EVERY INTERVAL '1 hour' "
                                       f"RUN AS {app.principal} CALL app.fails()")
    app.make_due("app.own")
    holder = _as(app.dsn, app.principal, autocommit=False)

    async def pause(point: str) -> None:
        if point == "executed":  # before the outcome is written: the owner takes the row now
            holder.execute("SELECT radix.alter_job('app.own', false)")

    async def go() -> None:
        async with Engine(app.dsn, node_id="patient", pause=pause) as engine:
            # the row stays held throughout: a wait for it would never end (120 s, then a failure)
            await asyncio.wait_for(engine.run_due(), 120)

    try:
        asyncio.run(go())
        assert holder.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # still held
    finally:
        holder.close()


def test_a_held_job_row_is_a_bounded_wait_for_drop_job(app: App) -> None:
    _prepare_victim(app)
    with _as(app.dsn, app.principal) as owner:
        catalog.execute_job_ddl(owner, f"CREATE JOB app.busy SCHEDULE EVERY INTERVAL '1 hour' "
                                       f"RUN AS {app.principal} CALL app.record('x')")
    with _as(app.dsn, app.principal, autocommit=False) as holder:
        holder.execute("SELECT radix.alter_job('app.busy', false)")
        with _as(app.dsn, app.principal, options=f"{GUARD} -c lock_timeout=300ms") as other:
            with pytest.raises(AdmissionError, match=r"^job app\.busy is being changed by another "
                                                     r"transaction; try again") as caught:
                catalog.drop_job(other, "app.busy")
            assert caught.value.code == "55P03"
            assert other.execute("SHOW lock_timeout").fetchone() == ("300ms",)


# -- a small separate server, for the NOTIFY queue and the embedded default ----------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, PgCluster]]:
    """An embedded server with the smallest NOTIFY queue PostgreSQL allows (64 pages, 512 kB)."""
    home = Path(tmp_path_factory.mktemp("small", numbered=True))
    server = EmbeddedServer(home, settings={"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                                            "max_notify_queue_pages": "64"})
    info, _ = server.ensure_running(persistent=True)
    try:
        yield home, PgCluster(info.dsn(), server)
    finally:
        server.release()
        server.destroy()


def _fill_queue(dsn: str, attacker: str) -> psycopg.Connection[Any]:
    """As ``attacker``: LISTEN and stay in a transaction, then NOTIFY until the queue is full. Returns the
    listener (the queue drains when it is closed)."""
    listener = _as(dsn, attacker, autocommit=False, options="")
    listener.execute("LISTEN flood")
    listener.commit()
    listener.execute("SELECT 1")  # idle in transaction from here: it reads nothing, the queue cannot drain
    full = None
    with _as(dsn, attacker, options="") as noisy:
        for batch in range(1000):  # 64 pages of about 8 kB: full after some 64 payloads
            try:
                with noisy.transaction():
                    for k in range(4):
                        noisy.execute("SELECT pg_notify('flood', repeat('x', 7900) || %s)", (f"{batch}.{k}",))
            except psycopg.Error as exc:
                full = str(exc)
                break
    assert full is not None
    assert "too many notifications in the NOTIFY queue" in full
    return listener


def test_a_full_notify_queue_fails_no_write_and_stops_no_scheduling(small: tuple[Path, PgCluster]) -> None:
    _, cluster = small
    with psycopg.connect(cluster.dsn, autocommit=True) as su:
        su.execute("CREATE DATABASE flood")
        su.execute("CREATE ROLE victim LOGIN; CREATE ROLE mallory LOGIN")
    dsn = cluster.dsn_for("flood")
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        migrate.install(conn)
        app = make_app(dsn, conn, "victim")
        _prepare_victim(app)
        listener = _fill_queue(dsn, "mallory")
        try:
            usage = conn.execute("SELECT pg_notification_queue_usage()").fetchone()
            assert usage
            assert usage[0] > 0.9
            with pytest.raises(psycopg.Error, match="too many notifications"):  # the attack is real
                conn.execute("NOTIFY anyone, 'hello'")
            _victim_writes(app)
            _scheduling_goes_on(app)
            conn.execute("CREATE DATABASE fresh")
            fresh = run_cli("install", "--dsn", cluster.dsn_for("fresh"), timeout=60)
            assert fresh.returncode == 0, fresh.stderr
            assert "applied" in fresh.stdout
        finally:
            listener.close()
    finally:
        conn.close()


def _victim_writes(app: App) -> None:
    with _as(app.dsn, app.principal) as victim:
        catalog.execute_job_ddl(victim, f"CREATE JOB app.tick SCHEDULE EVERY INTERVAL '1 second' "
                                        f"RUN AS {app.principal} CALL app.record('tick')")
        catalog.execute_job_ddl(victim, f"CREATE JOB app.spare SCHEDULE EVERY INTERVAL '1 hour' "
                                        f"RUN AS {app.principal} CALL app.record('spare')")
        assert catalog.alter_job(victim, "app.spare", enabled=False)
        assert catalog.drop_job(victim, "app.spare")
        result = documents.apply(victim, _document(1, app.principal, status="CRON_TABLE_ACTIVE"))
        assert result[0]["action"] == "created"


def _scheduling_goes_on(app: App) -> None:
    async def runs(docs: Engine, at_least: int) -> int:
        # the check and reload periods are an hour (_Watched): only the hintless look finds the run within 120 s
        await eventually(lambda: docs.counters["doc_runs"] >= at_least, within=120, message=f"{at_least} run(s)")
        return int(docs.counters["doc_runs"])

    async def go() -> tuple[int, int, int]:
        async with Engine(app.dsn, node_id="flooded") as engine:
            ran, deadline = 0, time.monotonic() + 120
            while ran < 1:  # the 1 s ticks come from the timer alone
                assert time.monotonic() < deadline, "no tick ran"
                ran += await engine.run_for(0.5, poll_s=0.5)
        watched = _Watched()
        async with Engine(app.dsn, node_id="flooded-docs", work=watched, jobs=False) as docs:
            serving = asyncio.create_task(docs.run_for(600))
            first = await runs(docs, 1)  # NUM 1, applied before: found by the first look
            await asyncio.wait_for(watched.idle.wait(), 120)  # NUM 1 done: nothing due for an hour
            await asyncio.to_thread(_apply_as_victim, app, 2)  # its wake-up is skipped: the queue is full
            second = await runs(docs, 2)
            docs.cancel.set()
            await serving
        return ran, first, second

    ran, first, second = asyncio.run(go())
    assert ran >= 1
    assert (first, second) == (1, 2)
    tags = [row[0] for row in app.conn.execute("SELECT tag FROM app.effects ORDER BY id").fetchall()]
    assert "tick" in tags
    assert tags.count("doc") == 2
    statuses = app.conn.execute("SELECT status FROM radix.sys_processes ORDER BY task_num").fetchall()
    assert statuses == [("completed",), ("completed",)]


class _Watched(Documents):
    """Sets ``idle`` once a look finds nothing due for a minute: the engine is about to sleep. Looks every hour
    at most: only the hintless look (HINTLESS_CHECK_S) finds a change whose wake-up was skipped sooner."""

    def __init__(self) -> None:
        super().__init__(check_period_s=3600.0, reload_period_s=3600.0)
        self.idle = asyncio.Event()

    def _plan_next_look(self, due: float | None, left: bool) -> None:
        if due is None or due > 60:
            self.idle.set()
        super()._plan_next_look(due, left)


def _apply_as_victim(app: App, num: int) -> None:
    with _as(app.dsn, app.principal) as victim:
        documents.apply(victim, _document(num, app.principal, status="CRON_TABLE_ACTIVE"))


def test_embedded_default_commands_ignore_the_old_install_key(small: tuple[Path, PgCluster]) -> None:
    home, cluster = small
    with psycopg.connect(cluster.dsn, autocommit=True) as su:
        su.execute("CREATE ROLE eve LOGIN")
    with _as(cluster.dsn, "eve", options="") as evil:  # held where the embedded default installs
        evil.execute("SELECT pg_advisory_lock(%s)", (migrate.MIGRATION_LOCK_KEY,))
        for command in (("jobs", "list"), ("install",), ("run", "--once")):  # the first one installs
            done = run_cli(*command, "--home", str(home), timeout=60)
            assert done.returncode == 0, (command, done.stderr)
    with psycopg.connect(cluster.dsn, autocommit=True) as su:
        assert migrate.installed_version(su) == migrate.code_version()
