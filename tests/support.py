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


def wait_for(predicate: Callable[[], T], timeout: float = 60.0, interval: float = 0.05,
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


def document_engine(dsn: str, *, node_id: str | None = None, concurrency: int = 8,
                    max_per_principal: int | None = None, jobs: bool = False, **documents: Any) -> Any:
    """An Engine running the CRON_TABLE documents of ``dsn`` (radixjobs.documents.runner.Documents, given
    ``documents`` as its options), and its jobs only with ``jobs``: ``engine.work`` is the Documents."""
    from radixjobs.documents.runner import Documents
    from radixjobs.engine import Engine

    return Engine(dsn, node_id=node_id, concurrency=concurrency, max_per_principal=max_per_principal,
                  work=Documents(**documents), jobs=jobs)


def document_counters(engine: Any) -> dict[str, int]:
    """The documents' counters of an engine (its fixed set, radixjobs.documents.runner.COUNTER_KEYS)."""
    from radixjobs.documents.runner import COUNTER_KEYS

    return {key: engine.counters[key] for key in COUNTER_KEYS}


async def document_runs(engine: Any) -> int:
    """``engine.run_due()``, counted as the CRON_TABLE runs it started (``radixjobs docs run --once``)."""
    before = engine.counters["doc_runs"]
    await engine.run_due()
    return int(engine.counters["doc_runs"] - before)
