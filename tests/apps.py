"""Engine test setup: a principal role, an app schema it may use, engine runners (fixture in conftest)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from radixjobs import catalog
from radixjobs.engine import Engine
from radixjobs.sqlscript import split_script


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
