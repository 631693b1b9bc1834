"""Connections radixjobs opens for itself, and one place that turns libpq failures into one-line errors.

Invariant: every connection radixjobs opens for its own statements (CLI, migrations, engine, daemon,
document scheduler) has ``search_path`` pinned to ``pg_catalog, pg_temp`` from its startup packet
(``scheduler_dsn``), so no function, operator, type or table another role creates — in ``public``, in a
schema named after the scheduler role (``"$user"``), or in a role default — can be chosen by a statement
radixjobs sends. A client option outranks role and database defaults (``ALTER ROLE … SET``), and only
the session itself could change it. Connections logged in as principals are made elsewhere
(``engine/principals.py``): their search_path is the principal's, and every statement radixjobs sends
there is schema-qualified instead.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from radixjobs.errors import ConnectError

PINNED_OPTIONS = "-c search_path=pg_catalog,pg_temp"


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
