"""Schema migrations against a real PostgreSQL."""

from __future__ import annotations

import re
import subprocess
import uuid
from typing import Any

import psycopg
import pytest

from radixjobs import migrate
from radixjobs.embedded import bin_dir
from radixjobs.errors import SchemaError


@pytest.mark.versions
def test_install_twice_changes_nothing(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        first = migrate.install(conn)
        assert [m.version for m in first] == [m.version for m in migrate.migrations()]
        ledger = conn.execute("SELECT version, applied_at FROM radix.schema_migrations").fetchall()
        assert migrate.install(conn) == []
        assert conn.execute("SELECT version, applied_at FROM radix.schema_migrations").fetchall() == ledger
        migrate.check_ready(conn)


def test_check_ready_asks_for_install(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn, pytest.raises(SchemaError, match="radixjobs install"):
        migrate.check_ready(conn)


def test_newer_schema_is_refused(conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO radix.schema_migrations (version, name) VALUES (9999, 'future')")
    with pytest.raises(SchemaError, match="newer than this radixjobs"):
        migrate.install(conn)
    with pytest.raises(SchemaError, match="upgrade radixjobs"):
        migrate.check_ready(conn)


def test_partial_install_applies_only_missing(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(migrate.read_sql("bootstrap.sql"))
        first = migrate.migrations()[0]
        conn.execute(first.sql)
        conn.execute("INSERT INTO radix.schema_migrations VALUES (%s, %s)", (first.version, first.name))
        applied = migrate.install(conn)
        assert [m.version for m in applied] == [m.version for m in migrate.migrations()[1:]]
        migrate.check_ready(conn)


def _dump(dsn: str) -> str:
    out = subprocess.run([str(bin_dir() / "pg_dump"), "--schema-only", "--schema=radix", "--no-owner", dsn],
                         check=True, capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines() if not ln.startswith("--") and not ln.startswith("\\")]
    return re.sub(r"\n{2,}", "\n", "\n".join(lines)).strip()


@pytest.mark.versions
def test_schema_sql_equals_all_migrations(pg: Any) -> None:
    names = [f"mig_{uuid.uuid4().hex[:8]}", f"mig_{uuid.uuid4().hex[:8]}"]
    dsns = []
    with psycopg.connect(pg.dsn, autocommit=True) as admin:
        for name in names:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name}")
            dsns.append(pg.dsn_for(name))
    try:
        with psycopg.connect(dsns[0], autocommit=True) as a:
            migrate.install(a, from_schema=True)
        with psycopg.connect(dsns[1], autocommit=True) as b:
            migrate.install(b, from_schema=False)
        assert _dump(dsns[0]) == _dump(dsns[1])
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as admin:
            for name in names:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.versions
def test_every_routine_with_settings_pins_jit_off(conn: psycopg.Connection[Any]) -> None:
    """Radix's statements are never JIT-compiled (0018_jit_off.sql): a routine with a SET clause sets jit = off;
    without one are only the inlinable SQL helpers and the runners of the jobs' own CALLs."""
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, l.lanname, p.proconfig FROM pg_proc p "
        "JOIN pg_language l ON l.oid = p.prolang WHERE p.pronamespace = 'radix'::regnamespace").fetchall()
    assert rows
    assert [name for name, _, config in rows if config is not None and "jit=off" not in config] == []
    unpinned = sorted(name.split("(")[0] for name, language, config in rows if config is None and language != "sql")
    assert unpinned == ["radix.run_tick", "radix.run_ticks"]
    # the finder's helpers that one principal does not reach (0019_plan_cache.sql; test_batches.py calls the rest)
    languages = {name.split("(")[0]: language for name, language, _ in rows}
    assert {languages[f"radix.{name}"] for name in ("_claim_shares", "node_alive", "job_has_live_frame")} == {"plpgsql"}
