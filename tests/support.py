"""Helpers shared by the tests (no fixtures here)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from radixjobs.embedded import EmbeddedServer

T = TypeVar("T")

# The DocScheduler seed's own example document (seeds/002): hourly log archiving, 5-minute retry, 3 errors.
SEED: dict[str, Any] = {
    "dockind": "CRON_TABLE",
    "status": "CRON_TABLE_ACTIVE",
    "props": {
        "NUM": 101,
        "DESCR": "Ежечасная архивация логов",
        "DB_FUNCTION": "archive_logs",
        "INTERVAL": "NOW() + INTERVAL '1 hour'",
        "INTERVAL_ERROR": "NOW() + INTERVAL '5 minutes'",
        "MAX_COUNT_ERROR": 3,
        "FIRST_RUN": "2025-01-01T00:00:00",
    },
}


@dataclass
class PgCluster:
    """The test session's cluster: a superuser DSN and, when embedded, its server."""

    dsn: str
    server: EmbeddedServer | None

    def dsn_for(self, dbname: str, user: str | None = None) -> str:
        params = conninfo_to_dict(self.dsn)
        params["dbname"] = dbname
        if user is not None:
            params["user"] = user
        return make_conninfo(**params)  # type: ignore[arg-type]


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05,
             message: str = "condition") -> T:
    """Poll until predicate() is truthy; returns its value, or fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
