"""Fixtures of the attacks: connections logged in as the roles a test made."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

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
