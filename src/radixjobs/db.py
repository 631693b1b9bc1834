"""Connections: one place that turns libpq failures into one-line user errors."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from radixjobs.errors import ConnectError


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
