"""The radix schema: versioned migrations for tables, and routines applied again whenever they change.

Two kinds of SQL file, each object defined once:

- ``sql/migrations/NNNN_name.sql``: tables, columns, indexes and data, applied in order and recorded in
  ``radix.schema_migrations``. The first is a baseline (the tables as they stood at its version); an install
  at ``UPGRADES_FROM`` or later already has the baseline's tables, which is recorded without running it; an
  older install is refused. Numbering after the baseline is gap-free.
- ``sql/routines/*.sql`` (in ``ROUTINES`` order): every function, view, trigger and grant, applied by an
  install whenever they or the installed routines changed, with ``CREATE OR REPLACE`` (an object whose shape
  cannot be replaced is dropped first; see ``routines.py``), then every radix routine, view and trigger not in
  them is dropped, and the source's checksum recorded in ``radix.routine_source``. ``grants.sql``, applied
  last, is the public API's allow-list. Readiness compares the recorded checksum with the code's.

Installs serialise on the row of ``radix.migration_lock`` (created by ``bootstrap.sql``), never on an
advisory key: any role can hold an advisory lock, and any role with USAGE on schema radix can hold table
locks on its tables (PREPARE locks without a privilege), but only a privileged statement can lock a row.
Every wait of an install is bounded (``db.lock_timeout_ms``) and ends in a one-line SchemaError naming
the sessions holding locks on radix objects. Any role reads the installed version through
``radix.schema_version()`` and the checksum through ``radix.routine_checksum()``; the ledger itself stays the
installer's. The schema-change notification is a hint, skipped while the notification queue is half full (a
full queue would fail the COMMIT).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import psycopg
from psycopg import errors

from radixjobs import routines
from radixjobs.db import bound_lock_waits, lock_timeout_ms
from radixjobs.errors import SchemaError

# The advisory key installs once took (the bytes "radixmig" as a big-endian bigint). Nothing takes
# it any more; kept so tests can show that a role holding it blocks nothing.
MIGRATION_LOCK_KEY = int.from_bytes(b"radixmig", "big", signed=True)
# Above this pg_notification_queue_usage() notifications are skipped (radix._hint uses the same level).
NOTIFY_QUEUE_LIMIT = 0.5
BOOTSTRAP_ATTEMPTS = 3
_BOOTSTRAPPED = ("SELECT pg_catalog.to_regclass('radix.schema_migrations') IS NOT NULL "
                 "AND pg_catalog.to_regclass('radix.migration_lock') IS NOT NULL")
_LOCK_HOLDERS = """
SELECT DISTINCT l.pid, a.usename FROM pg_catalog.pg_locks l
JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) l.relation
WHERE l.granted AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
  AND c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace('radix')
ORDER BY 1 LIMIT 5
"""
# Is radix there; does radix.schema_version() exist; may this role read the ledger itself?
VERSION_PROBE = (
    "SELECT pg_catalog.to_regclass('radix.schema_migrations') IS NOT NULL, "
    "pg_catalog.to_regprocedure('radix.schema_version()') IS NOT NULL, "
    "CASE WHEN pg_catalog.to_regclass('radix.schema_migrations') IS NOT NULL "
    "THEN pg_catalog.has_table_privilege('radix.schema_migrations', 'SELECT') END")
# A schema without radix.schema_version(), read by a role that may not read its ledger: older than any code asks for.
VERSION_UNKNOWN = 0
# Does radix.routine_checksum() exist; then: the routines' checksum, for any role.
CHECKSUM_PROBE = "SELECT pg_catalog.to_regprocedure('radix.routine_checksum()') IS NOT NULL"
CHECKSUM_QUERY = "SELECT radix.routine_checksum()"
# The oldest installed version this code upgrades: from it on, the tables are the baseline's.
UPGRADES_FROM = 17
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
    """All known migrations in version order: the baseline, then each next version without gaps."""
    found = []
    for entry in resources.files("radixjobs").joinpath("sql", "migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if not found or [m.version for m in found] != list(range(found[0].version, found[0].version + len(found))):
        raise SchemaError("migration files are not numbered without gaps after the baseline")
    return tuple(found)


def code_version() -> int:
    """The schema version this code needs."""
    return migrations()[-1].version


def installed_version(conn: psycopg.Connection[Any]) -> int | None:
    """The database's schema version, or None when radixjobs was never installed there.

    Any role may ask: radix.schema_version() reads the ledger for it. Without that function only the ledger
    exists; a role that may not read it learns only that the schema is older than any code asks for
    (VERSION_UNKNOWN).
    """
    # qualified: the connection may be the user's own (``radixjobs sql``), with the user's search_path
    probe = conn.execute(VERSION_PROBE).fetchone()
    if not probe or not probe[0]:
        return None
    query = version_query(probe)
    if query is None:
        return VERSION_UNKNOWN
    row = conn.execute(query).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def version_query(probe: Sequence[Any]) -> str | None:
    """The query that reads the version, given VERSION_PROBE's row (radix installed); None: none may."""
    if probe[1]:
        return "SELECT radix.schema_version()"
    if probe[2]:
        return "SELECT pg_catalog.max(version) FROM radix.schema_migrations"
    return None


def install(conn: psycopg.Connection[Any]) -> list[Migration]:
    """Apply the missing migrations and, when changed, the routines, in one transaction; returns the migrations
    recorded (empty: the tables were up to date)."""
    try:
        _bootstrap(conn)
        with conn.transaction():
            _pin(conn)
            conn.execute("SELECT FROM radix.migration_lock FOR UPDATE")
            current = installed_version(conn)
            _refuse_newer(current)
            if current == VERSION_UNKNOWN:
                raise SchemaError(f"role {conn.info.user!r} may not read the radix schema's version in database "
                                  f"{conn.info.dbname!r}: run `radixjobs install` as the role that owns schema radix")
            if current is not None and current < UPGRADES_FROM:
                raise SchemaError(f"the radix schema in database {conn.info.dbname!r} is at version {current}; "
                                  f"this radixjobs upgrades version {UPGRADES_FROM} or newer: upgrade with an "
                                  "older radixjobs first")
            missing = [m for m in migrations() if current is None or m.version > current]
            baseline = migrations()[0]
            for migration in missing:
                if current is None or migration is not baseline:  # an install since UPGRADES_FROM has its tables
                    conn.execute(migration.sql)
                conn.execute("INSERT INTO radix.schema_migrations (version, name) "
                              "VALUES (%s::pg_catalog.int4, %s::pg_catalog.text)", (migration.version, migration.name))
            changed = routines.apply(conn)
            if missing or changed:
                conn.execute("SELECT pg_catalog.pg_notify('radix_schema', %s::pg_catalog.text) "
                             "WHERE pg_catalog.pg_notification_queue_usage() OPERATOR(pg_catalog.<) "
                             "%s::pg_catalog.float8", (str(code_version()), NOTIFY_QUEUE_LIMIT))
    except errors.LockNotAvailable:
        raise SchemaError(_lock_timeout_message(conn)) from None
    except errors.InsufficientPrivilege as exc:
        raise SchemaError(f"role {conn.info.user!r} may not install or upgrade radixjobs in database "
                          f"{conn.info.dbname!r} ({exc.diag.message_primary}): run `radixjobs install` as the "
                          "role that owns schema radix") from None
    return missing


def _routine_checksum(conn: psycopg.Connection[Any]) -> str | None:
    """The checksum of the routines installed (None: none recorded, or a schema from before it was)."""
    probe = conn.execute(CHECKSUM_PROBE).fetchone()
    if not probe or not probe[0]:
        return None
    row = conn.execute(CHECKSUM_QUERY).fetchone()
    return str(row[0]) if row and row[0] is not None else None


def _bootstrap(conn: psycopg.Connection[Any]) -> None:
    """Create schema radix, the ledger and the install lock's row when missing (committed at once)."""
    for attempt in range(BOOTSTRAP_ATTEMPTS):
        try:
            with conn.transaction():
                _pin(conn)
                row = conn.execute(_BOOTSTRAPPED).fetchone()
                if row and row[0]:
                    return
                conn.execute(read_sql("bootstrap.sql"))
            return
        except (errors.UniqueViolation, errors.DuplicateSchema, errors.DuplicateTable, errors.DuplicateObject):
            if attempt == BOOTSTRAP_ATTEMPTS - 1:  # another first install won each race: its objects exist
                raise


def _pin(conn: psycopg.Connection[Any]) -> None:
    """For this transaction: search_path pinned (the caller's connection may not be one of ours: tests, the
    Python API) and lock waits bounded."""
    conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
    bound_lock_waits(conn, local=True)


def _lock_timeout_message(conn: psycopg.Connection[Any]) -> str:
    """The one-line error of an install that waited too long for a lock; names who holds radix locks."""
    text = (f"install waited more than {lock_timeout_ms() / 1000:g}s for a lock in database "
            f"{conn.info.dbname!r} and changed nothing")
    try:
        holders = conn.execute(_LOCK_HOLDERS).fetchall()
    except psycopg.Error:
        holders = []
    if holders:
        text += "; sessions holding locks on radix objects: " + ", ".join(
            f"pid {pid} ({user})" for pid, user in holders)
    return text + ": end them or retry (RADIXJOBS_LOCK_TIMEOUT sets the wait)"


def _refuse_newer(current: int | None) -> None:
    if current is not None and current > code_version():
        raise SchemaError(
            f"the radix schema is at version {current}, newer than this radixjobs knows "
            f"({code_version()}): upgrade radixjobs")


def check_ready(conn: psycopg.Connection[Any]) -> None:
    """Raise SchemaError unless the radix schema is installed at exactly the code's version and routines."""
    current = installed_version(conn)
    _refuse_newer(current)
    if current is None:
        raise SchemaError(f"radixjobs is not installed in database {conn.info.dbname!r}: "
                          "run `radixjobs install`")
    if current < code_version():
        at = "an older version" if current == VERSION_UNKNOWN else f"version {current}"
        raise SchemaError(f"the radix schema in database {conn.info.dbname!r} is at {at}, "
                          f"this radixjobs needs {code_version()}: run `radixjobs install`")
    if _routine_checksum(conn) != routines.checksum():
        raise SchemaError(f"the radix routines in database {conn.info.dbname!r} are not this radixjobs' own "
                          "(another version installed them): run `radixjobs install`")
