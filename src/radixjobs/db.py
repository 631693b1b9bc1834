"""Connections radixjobs opens for itself, and one place that turns libpq failures into one-line errors.

Invariant: every connection radixjobs opens for its own statements (CLI, migrations, engine, daemon,
document scheduler) has ``search_path`` pinned to ``pg_catalog, pg_temp`` from its startup packet
(``scheduler_dsn``), so no function, operator, type or table another role creates — in ``public``, in a
schema named after the scheduler role (``"$user"``), or in a role default — can be chosen by a statement
radixjobs sends. A client option outranks role and database defaults (``ALTER ROLE … SET``), and only
the session itself could change it. Connections logged in as principals are made elsewhere
(``engine/principals.py``): their search_path is the principal's, and every statement radixjobs sends
there is schema-qualified instead.

Second invariant: every statement radixjobs sends for itself (the CLI's reads, installs, the engine's and
the document scheduler's verbs) waits for a lock at most ``lock_timeout_ms()`` (RADIXJOBS_LOCK_TIMEOUT
seconds, default 5): an ordinary role can hold table locks on radix tables (PREPARE takes them without a
privilege) and row locks on its own jobs and documents, and nothing the scheduler does may wait on those
unbounded. Users' own SQL (``radixjobs sql``) keeps the session's setting.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
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


PINNED_OPTIONS = "-c search_path=pg_catalog,pg_temp"

# How long a connection pool may take to fill once a direct connection of the same DSN succeeded (engine
# and document scheduler start): a server gone meanwhile fails the start soon, and the owner's reconnect
# loop, not the pool's own 30-second wait, decides when to try again.
POOL_OPEN_TIMEOUT_S = 5.0


def scheduler_dsn(dsn: str) -> str:
    """``dsn`` with the pinned search_path appended to its libpq ``options`` (idempotent).

    Appended last, so it wins over a search_path the DSN's own options set.
    """
    params = conninfo_to_dict(dsn)
    options = str(params.get("options") or "")
    if options.endswith(PINNED_OPTIONS):
        return dsn
    params["options"] = f"{options} {PINNED_OPTIONS}".strip()
    return make_conninfo(**params)  # type: ignore[arg-type]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connect(dsn: str, *, autocommit: bool = True, pinned: bool = True, **kwargs: Any) -> psycopg.Connection[Any]:
    """Open a sync connection of radixjobs' own (pinned search_path); ConnectError with libpq's message.

    ``pinned=False`` is for running the user's own SQL text in the user's own session (``radixjobs sql``),
    as psql would: unqualified names there mean what the user's search_path says.
    """
    try:
        return psycopg.connect(scheduler_dsn(dsn) if pinned else dsn, autocommit=autocommit, **kwargs)
    except psycopg.OperationalError as exc:
        raise ConnectError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None


def connect_dict(dsn: str, *, autocommit: bool = True) -> psycopg.Connection[dict[str, Any]]:
    """Like connect(), with rows as dicts."""
    try:
        return psycopg.connect(scheduler_dsn(dsn), autocommit=autocommit, row_factory=dict_row)
    except psycopg.OperationalError as exc:
        raise ConnectError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None


async def aconnect(dsn: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """Open an async connection; connection failures raise ConnectError."""
    try:
        return await psycopg.AsyncConnection.connect(scheduler_dsn(dsn), autocommit=autocommit, **kwargs)
    except psycopg.OperationalError as exc:
        raise ConnectError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None
