"""One real PostgreSQL per test session, a template database with the schema, a fresh database per test.

The server is the embedded one in a temporary directory, or ``RADIXJOBS_TEST_DSN`` when set (a superuser
DSN of a disposable cluster: tests create databases and roles in it). ``RADIXJOBS_TEST_PG_BIN`` starts the
embedded server from another PostgreSQL's binaries (.ci/run's version matrix: scripts/postgres_versions.py).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from radixjobs import migrate
from radixjobs.embedded import EmbeddedServer
from tests.apps import App, make_app
from tests.support import PgCluster


@pytest.fixture(scope="session")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgCluster]:
    """The session's PostgreSQL cluster."""
    dsn = os.environ.get("RADIXJOBS_TEST_DSN")
    if dsn:
        yield PgCluster(dsn, None)
        return
    home = Path(tmp_path_factory.mktemp("pg", numbered=True))
    binaries = os.environ.get("RADIXJOBS_TEST_PG_BIN")
    server = EmbeddedServer(home, settings={"fsync": "off", "synchronous_commit": "off",
                                            "full_page_writes": "off"}, binaries=Path(binaries) if binaries else None)
    info, _ = server.ensure_running(persistent=True)
    try:
        yield PgCluster(info.dsn(), server)
    finally:
        server.release()
        server.destroy()


@pytest.fixture(scope="session")
def template_db(pg: PgCluster) -> str:
    """Name of a template database with the radix schema installed."""
    name = f"radix_template_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with psycopg.connect(pg.dsn_for(name), autocommit=True) as conn:
        migrate.install(conn)
    return name


@pytest.fixture
def db(pg: PgCluster, template_db: str, roles: Any) -> Iterator[str]:
    """DSN of a fresh database cloned from the template, dropped after the test (before its roles)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template_db)))
    try:
        yield pg.dsn_for(name)
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def empty_db(pg: PgCluster) -> Iterator[str]:
    """DSN of a fresh database without the radix schema."""
    name = f"e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield pg.dsn_for(name)
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def conn(db: str) -> Iterator[psycopg.Connection[Any]]:
    """A superuser autocommit connection to the test's database."""
    with psycopg.connect(db, autocommit=True) as c:
        yield c


@pytest.fixture
def roles(pg: PgCluster) -> Iterator[Any]:
    """Make cluster roles with unique names; dropped after the test (after its database is gone)."""
    made: list[str] = []

    def make(prefix: str, options: str = "LOGIN") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute(sql.SQL("CREATE ROLE {} " + options).format(sql.Identifier(name)))  # type: ignore[arg-type]
        made.append(name)
        return name

    yield make
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        for name in reversed(made):
            c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def app(db: str, conn: psycopg.Connection[Any], roles: Any) -> App:
    """A database with schema ``app``, a LOGIN principal that may use it, and app.record(tag)."""
    return make_app(db, conn, roles("worker"))


@pytest.fixture
def batchable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every procedure counts as short once it has run (BATCH_TICK_MS), a batch's size does not depend on
    its duration (BATCH_BUDGET_MS), a lone tick is not published as a lease while it runs (PUBLISH_AFTER_S)
    and a batch is not cancelled for its time (BATCH_RUN_S): a first run's time on a busy machine (a new
    backend, plans, compiled functions) would make the batches depend on the clock. A batch still ends at its
    ticks' statement timeout."""
    from radixjobs.engine import batches, tick_runner, ticks

    monkeypatch.setattr(ticks, "BATCH_TICK_MS", 60_000.0)
    monkeypatch.setattr(ticks, "BATCH_BUDGET_MS", 1e12)
    monkeypatch.setattr(tick_runner, "PUBLISH_AFTER_S", 3600.0)
    monkeypatch.setattr(batches, "BATCH_RUN_S", 3600.0)


@pytest.fixture(scope="session")
def external_pg() -> Iterator[Any]:
    """A distribution PostgreSQL cluster with scram passwords (tests/external.py); skipped when none is
    installed, except in CI (.ci/run installs it and sets RADIXJOBS_REQUIRE_EXTERNAL_PG)."""
    from tests.external import distribution_bin, external_cluster

    if distribution_bin() is None:
        if os.environ.get("RADIXJOBS_REQUIRE_EXTERNAL_PG") or os.environ.get("CI"):
            pytest.fail("no distribution PostgreSQL (/usr/lib/postgresql/*/bin/initdb): .ci/run installs it")
        pytest.skip("no distribution PostgreSQL installed (/usr/lib/postgresql/*/bin/initdb): "
                    "apt-get install postgresql")
    yield from external_cluster()


@pytest.fixture
def ext(external_pg: Any) -> Iterator[Any]:
    """A fresh database of the external cluster, the radix schema installed by the scheduler role itself."""
    from tests.acceptance.conftest import run_cli
    from tests.external import drop_database, new_database

    db = new_database(external_pg)
    done = run_cli("install", "--dsn", db.dsn())
    assert done.returncode == 0, done.stderr
    try:
        yield db
    finally:
        drop_database(db)
