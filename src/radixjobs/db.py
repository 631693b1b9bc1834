"""Connections: one place that turns libpq failures into one-line user errors, and bounds lock waits.

Invariant: every statement radixjobs sends for itself (the CLI's reads, installs, the engine's and the
document scheduler's verbs) waits for a lock at most ``lock_timeout_ms()`` (RADIXJOBS_LOCK_TIMEOUT
seconds, default 5): an ordinary role can hold table locks on radix tables (PREPARE takes them without a
privilege) and row locks on its own jobs and documents, and nothing the scheduler does may wait on those
unbounded. Users' own SQL (``radixjobs sql``) keeps the session's setting.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from psycopg.rows import dict_row

from radixjobs.errors import ConfigError, ConnectError

DEFAULT_LOCK_TIMEOUT_S = 5.0
MAX_LOCK_TIMEOUT_S = 3600.0
SET_LOCK_TIMEOUT = b"SELECT pg_catalog.set_config('lock_timeout', %s::pg_catalog.text, %s::pg_catalog.bool)"


def lock_timeout_ms() -> int:
    """The bound on radixjobs' own lock waits, in milliseconds (RADIXJOBS_LOCK_TIMEOUT, in seconds)."""
    raw = os.environ.get("RADIXJOBS_LOCK_TIMEOUT", "").strip()
    if not raw:
        return round(DEFAULT_LOCK_TIMEOUT_S * 1000)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_LOCK_TIMEOUT_S:  # also refuses nan
        raise ConfigError(f"RADIXJOBS_LOCK_TIMEOUT must be a number of seconds in (0, {MAX_LOCK_TIMEOUT_S:g}], "
                          f"got {raw!r}")
    return max(1, round(seconds * 1000))


def bound_lock_waits(conn: psycopg.Connection[Any], *, local: bool = False) -> None:
    """Set lock_timeout to the bound for the session (``local``: for the current transaction only)."""
    conn.execute(SET_LOCK_TIMEOUT, (f"{lock_timeout_ms()}ms", local))


async def abound_lock_waits(conn: psycopg.AsyncConnection[Any]) -> None:
    """bound_lock_waits for an async (autocommit) connection; usable as a pool's ``configure``."""
    await conn.execute(SET_LOCK_TIMEOUT, (f"{lock_timeout_ms()}ms", False))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connect(dsn: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection[Any]:
    """Open a sync connection; connection failures raise ConnectError with libpq's message."""
    try:
        return psycopg.connect(dsn, autocommit=autocommit, **kwargs)
    except psycopg.OperationalError as exc:
        raise ConnectError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None


def connect_dict(dsn: str, *, autocommit: bool = True) -> psycopg.Connection[dict[str, Any]]:
    """Like connect(), with rows as dicts."""
    try:
        return psycopg.connect(dsn, autocommit=autocommit, row_factory=dict_row)
    except psycopg.OperationalError as exc:
        raise ConnectError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None


async def aconnect(dsn: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """Open an async connection; connection failures raise ConnectError."""
    try:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, **kwargs)
    except psycopg.OperationalError as exc:
        raise ConnectError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None
