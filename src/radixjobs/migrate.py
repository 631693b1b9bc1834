"""Versioned, forward-only schema migrations, applied under an advisory lock and recorded in a table.

``sql/migrations/NNNN_name.sql`` are the steps; ``sql/schema.sql`` is the current schema in one file, used
for a fresh install. A test checks that both build the same database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import psycopg

from radixjobs.errors import SchemaError

# pg_advisory_xact_lock key: the bytes "radixmig" read as a big-endian bigint
MIGRATION_LOCK_KEY = int.from_bytes(b"radixmig", "big", signed=True)
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def read_sql(name: str) -> str:
    """Text of a file under radixjobs/sql/."""
    return resources.files("radixjobs").joinpath("sql", name).read_text(encoding="utf-8")


@cache
def migrations() -> tuple[Migration, ...]:
    """All known migrations in version order (numbering must be gap-free from 1)."""
    found = []
    for entry in resources.files("radixjobs").joinpath("sql", "migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise SchemaError("migration files are not numbered 0001, 0002, … without gaps")
    return tuple(found)


def code_version() -> int:
    """The schema version this code needs."""
    return migrations()[-1].version


def installed_version(conn: psycopg.Connection[Any]) -> int | None:
    """The database's schema version, or None when radixjobs was never installed there."""
    # qualified: the connection may be the user's own (``radixjobs sql``), with the user's search_path
    row = conn.execute("SELECT pg_catalog.to_regclass('radix.schema_migrations') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return None
    row = conn.execute("SELECT pg_catalog.max(version) FROM radix.schema_migrations").fetchone()
    return int(row[0]) if row and row[0] is not None else None


def install(conn: psycopg.Connection[Any], *, from_schema: bool = True) -> list[Migration]:
    """Apply what is missing in one transaction; returns the migrations applied (empty: up to date).

    A fresh database gets ``schema.sql`` (unless ``from_schema`` is False: then every migration).
    """
    with conn.transaction():
        # the caller's connection may not be one of ours (tests, the Python API): pin it here too
        conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        current = installed_version(conn)
        _refuse_newer(current)
        conn.execute(read_sql("bootstrap.sql"))
        missing = [m for m in migrations() if current is None or m.version > current]
        if current is None and from_schema:
            conn.execute(read_sql("schema.sql"))
        else:
            for migration in missing:
                conn.execute(migration.sql)
        for migration in missing:
            conn.execute("INSERT INTO radix.schema_migrations (version, name) VALUES (%s, %s)",
                         (migration.version, migration.name))
        if missing:
            conn.execute("SELECT pg_notify('radix_schema', %s)", (str(code_version()),))
    return missing


def _refuse_newer(current: int | None) -> None:
    if current is not None and current > code_version():
        raise SchemaError(
            f"the radix schema is at version {current}, newer than this radixjobs knows "
            f"({code_version()}): upgrade radixjobs")


def check_ready(conn: psycopg.Connection[Any]) -> None:
    """Raise SchemaError unless the radix schema is installed at exactly the code's version."""
    current = installed_version(conn)
    _refuse_newer(current)
    if current is None:
        raise SchemaError(f"radixjobs is not installed in database {conn.info.dbname!r}: "
                          "run `radixjobs install`")
    if current < code_version():
        raise SchemaError(f"the radix schema in database {conn.info.dbname!r} is at version {current}, "
                          f"this radixjobs needs {code_version()}: run `radixjobs install`")
