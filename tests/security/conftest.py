"""Fixtures of the attacks: connections logged in as the roles a test made; a cluster that checks passwords."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from radixjobs.embedded import EmbeddedServer
from tests.apps import App


@pytest.fixture
def login(app: App) -> Iterator[Any]:
    """``login(role)``: an autocommit connection to the app's database as that role, closed after the test."""
    opened: list[psycopg.Connection[Any]] = []

    def connect(user: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(make_conninfo(app.dsn, user=user), autocommit=True)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()


@pytest.fixture
def password_cluster(tmp_path: Path) -> Iterator[tuple[EmbeddedServer, str]]:
    """A cluster of its own that checks passwords (scram) on its socket; returns it and its superuser DSN."""
    server = EmbeddedServer(tmp_path / "pwpg", settings={"fsync": "off", "synchronous_commit": "off"})
    info, _ = server.ensure_running(persistent=True)
    try:
        yield server, info.dsn()
    finally:
        server.release()
        server.destroy()
