"""Engine test setup: a principal role, an app schema it may use, engine runners (fixture in conftest)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from radixjobs import catalog
from radixjobs.engine import Engine
from radixjobs.engine.attempt import TICK_ROW
from radixjobs.engine.batches import BatchItem, batch_query
from radixjobs.engine.definitions import LOAD_DEFINITIONS, JobDefinition, definition_from_row
from radixjobs.engine.ticks import FIND_TICKS, Tick
from radixjobs.sqlscript import split_script
from tests.support import wait_for


@dataclass
class App:
    """A database with schema ``app``, a LOGIN principal that may use it, and an effects table."""

    dsn: str
    conn: psycopg.Connection[Any]
    principal: str

    def job(self, ddl: str) -> str:
        """Create a job from DDL (``{p}`` stands for the principal); returns its qualified name."""
        stmt = ddl.format(p=self.principal)
        catalog.execute_job_ddl(self.conn, stmt)
        return stmt.split()[2] if stmt.split()[2].upper() != "IF" else stmt.split()[5]

    def state(self, name: str) -> dict[str, Any]:
        job = catalog.get_job(self.conn, name)
        assert job is not None
        return job

    def history(self, name: str) -> list[dict[str, Any]]:
        return list(reversed(catalog.job_history(self.conn, name, 256)))

    def effects(self) -> list[tuple[Any, ...]]:
        return self.conn.execute("SELECT * FROM app.effects ORDER BY id").fetchall()

    def make_due(self, name: str) -> None:
        """Make a job's current tick due now, keeping its planned time (a controllable clock)."""
        self.conn.execute("UPDATE radix.radix_system_job_state SET due_ns = radix.to_ns(clock_timestamp()) "
                          "WHERE job_id = (SELECT job_id FROM radix.job_overview WHERE name = %s)", (name,))

    def run(self, **kwargs: Any) -> Engine:
        """Run everything due once with a fresh engine; returns it (for its counters)."""
        return run_engine(self.dsn, lambda e: e.run_due(), **kwargs)


class Background:
    """An engine running due work in a thread until stopped (one slot: one principal connection)."""

    def __init__(self, dsn: str, **kwargs: Any):
        self.dsn = dsn
        self.kwargs = kwargs
        self.loop = asyncio.new_event_loop()
        self.stop: asyncio.Event | None = None
        self.engine: Engine | None = None
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._run(),))

    async def _run(self) -> None:
        self.stop = asyncio.Event()
        async with Engine(self.dsn, **self.kwargs) as engine:
            self.engine = engine
            while not self.stop.is_set():
                await engine.dispatch_due()
                await engine.wait_for_work(0.05)

    def __enter__(self) -> Background:
        self.thread.start()
        wait_for(lambda: self.engine is not None)
        return self

    def __exit__(self, failed: object, *exc: object) -> None:
        assert self.stop is not None
        assert self.engine is not None
        if failed is not None:  # a waiting attempt would hold the engine open: cancel it
            self.loop.call_soon_threadsafe(self.engine.cancel.set)
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(60)
        if not self.thread.is_alive():
            self.loop.close()


@contextlib.contextmanager
def holding(app: App, lock: int) -> Iterator[psycopg.Connection[Any]]:
    """An advisory lock held by a superuser session until the block ends (procedures wait on it, so
    their attempt stays open while a test looks at it)."""
    conn = psycopg.connect(app.dsn, autocommit=True)
    try:
        conn.execute("SELECT pg_advisory_lock(%s)", (lock,))
        yield conn
    finally:
        conn.close()


def waiting_on(app: App, lock: int) -> tuple[int, str]:
    """The attempt waiting on advisory lock ``lock``, as the principal's own session sees it in
    pg_stat_activity: its backend pid and its query text."""
    with psycopg.connect(app.dsn, user=app.principal, autocommit=True) as spy:
        def seen() -> tuple[int, str] | None:
            row = spy.execute("SELECT a.pid, a.query FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
                              "WHERE l.locktype = 'advisory' AND l.objid = %s AND NOT l.granted",
                              (lock,)).fetchone()
            return (row[0], row[1]) if row else None
        return wait_for(seen)


def run_engine(dsn: str, action: Callable[[Engine], Any], **kwargs: Any) -> Engine:
    async def go() -> Engine:
        async with Engine(dsn, **kwargs) as engine:
            await action(engine)
        return engine

    return asyncio.run(go())


APP_SQL = """
CREATE SCHEMA app;
CREATE TABLE app.effects (id bigserial PRIMARY KEY, tag text, who text, sess text, job uuid, attempt int,
                          key text, scheduled timestamptz, at timestamptz DEFAULT clock_timestamp());
GRANT USAGE ON SCHEMA app TO {p};
GRANT INSERT, SELECT ON app.effects TO {p};
GRANT USAGE ON SEQUENCE app.effects_id_seq TO {p};
CREATE PROCEDURE app.record(tag text) LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO app.effects (tag, who, sess, job, attempt, key, scheduled)
  VALUES (tag, current_user, session_user, radix.current_job_id(), radix.current_job_attempt(),
          radix.current_idempotency_key(), radix.current_job_scheduled_at());
END $$;
"""


def make_app(db: str, conn: psycopg.Connection[Any], principal: str) -> App:
    """Create the app schema, its effects table and app.record(tag) for ``principal``."""
    for stmt in split_script(APP_SQL):
        if "{p}" in stmt.text:
            template = sql.SQL(stmt.text.replace("{p}", "{}"))  # type: ignore[arg-type]
            conn.execute(template.format(sql.Identifier(principal)))
        else:
            conn.execute(stmt.text.encode())
    return App(db, conn, principal)


def found_ticks(app: App, node: str = "n") -> list[Tick]:
    """The due ticks radix.find_ticks hands out to node ``node`` (registered here), up to 10."""
    app.conn.execute("SELECT radix.register_node(%s, 'localhost', 0)", (node,))
    return [Tick.from_row(row, time.monotonic())
            for row in app.conn.execute(FIND_TICKS.encode(), (node, 10, 0, [], [], [])).fetchall()]


def definitions(app: App, ticks: list[Tick]) -> dict[Any, JobDefinition]:
    """The jobs' definitions of ``ticks`` as the daemon loads and caches them."""
    with app.conn.cursor(row_factory=dict_row) as cur:
        return {row["job_id"]: definition_from_row(row)
                for row in cur.execute(LOAD_DEFINITIONS.encode(), ([t.job_id for t in ticks],)).fetchall()}


def batch_outcomes(app: App, ticks: list[Tick], cached: dict[Any, JobDefinition]) -> dict[Any, tuple[Any, ...]]:
    """Run ``ticks`` as one batch on a principal's session, with the definitions ``cached``: each job's
    outcome row (None first: it ran)."""
    with psycopg.connect(app.dsn, user=app.principal, autocommit=True) as principal:
        session = principal.execute("SELECT radix.attempt_session()").fetchone()
        assert session is not None
        items = [BatchItem(cached[t.job_id], t, None) for t in ticks]
        with principal.cursor() as cur:
            cur.execute(batch_query(items, bytes.fromhex(session[0]), "6e"), prepare=False)
            for _ in range(TICK_ROW):
                cur.nextset()
            return {t.job_id: r for t, r in zip(ticks, cur.fetchall(), strict=True)}
