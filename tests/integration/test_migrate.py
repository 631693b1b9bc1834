"""Schema migrations against a real PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from radixjobs import migrate
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


SCHEMA_17 = Path(__file__).parent / "schemas" / "schema_17.sql"
_CATALOG: dict[str, str] = {
    "function": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.prosecdef, p.proconfig, p.provolatile,
               pg_get_userbyid(p.proowner), obj_description(p.oid, 'pg_proc'),
               ARRAY(SELECT format('%s:%s:%s', a.grantee::regrole, a.privilege_type, a.is_grantable)
                     FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a ORDER BY 1)
        FROM pg_proc p WHERE p.pronamespace = 'radix'::regnamespace""",
    "relation": """
        SELECT c.oid::regclass::text, c.relkind, c.reloptions, pg_get_userbyid(c.relowner),
               obj_description(c.oid, 'pg_class'),
               CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) END,
               ARRAY(SELECT format('%s:%s:%s', a.grantee::regrole, a.privilege_type, a.is_grantable)
                     FROM aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a ORDER BY 1)
        FROM pg_class c WHERE c.relnamespace = 'radix'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'S')""",
    "column": """
        SELECT format('%s.%s', a.attrelid::regclass, a.attname), a.attnum, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'radix'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraint": """
        SELECT format('%s.%s', c.conrelid::regclass, c.conname), pg_get_constraintdef(c.oid)
        FROM pg_constraint c WHERE c.connamespace = 'radix'::regnamespace""",
    "index": """
        SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = 'radix'::regnamespace""",
    "trigger": """
        SELECT format('%s.%s', t.tgrelid::regclass, t.tgname), pg_get_triggerdef(t.oid), t.tgenabled
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'radix'::regnamespace AND NOT t.tgisinternal""",
    "schema": """
        SELECT n.nspname::text, pg_get_userbyid(n.nspowner), obj_description(n.oid, 'pg_namespace'),
               ARRAY(SELECT format('%s:%s', a.grantee::regrole, a.privilege_type)
                     FROM aclexplode(n.nspacl) a ORDER BY 1)
        FROM pg_namespace n WHERE n.nspname = 'radix'""",
}

def _catalog(conn: psycopg.Connection[Any]) -> dict[str, dict[str, tuple[Any, ...]]]:
    conn.execute("SET search_path = pg_catalog, pg_temp")
    return {kind: {row[0]: tuple(row[1:]) for row in conn.execute(query).fetchall()}
            for kind, query in _CATALOG.items()}


@contextmanager
def _databases(pg: Any, count: int) -> Iterator[list[str]]:
    names = [f"mig_{uuid.uuid4().hex[:8]}" for _ in range(count)]
    with psycopg.connect(pg.dsn, autocommit=True) as admin:
        for name in names:
            admin.execute(f"CREATE DATABASE {name}")
    try:
        yield [pg.dsn_for(name) for name in names]
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as admin:
            for name in names:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _install_17(conn: psycopg.Connection[Any]) -> None:
    """A database as schema 17's installer left it: the schema and its ledger rows 1-17."""
    conn.execute(migrate.read_sql("bootstrap.sql"))
    conn.execute(SCHEMA_17.read_text(encoding="utf-8"))
    conn.execute("INSERT INTO radix.schema_migrations (version, name) SELECT v, 'v' || v FROM generate_series(1, 17) v")


@pytest.mark.versions
def test_a_fresh_install_and_an_upgrade_from_17_are_identical(pg: Any) -> None:
    """Object by object: functions (definitions, settings, owners, grants), tables and views (columns,
    defaults, constraints, indexes, grants), triggers, comments and the schema's grants."""
    with _databases(pg, 2) as (fresh, upgraded):
        with psycopg.connect(fresh, autocommit=True) as conn:
            migrate.install(conn)
            want = _catalog(conn)
        with psycopg.connect(upgraded, autocommit=True) as conn:
            _install_17(conn)
            assert [m.version for m in migrate.install(conn)] == [m.version for m in migrate.migrations()]
            migrate.check_ready(conn)
            got = _catalog(conn)
        for kind in want:
            assert got[kind] == want[kind], kind
        assert "radix.run_tick(uuid,bigint,text,text,bigint,text)" not in want["function"]
        assert not [name for name in want["function"] if name.startswith("radix._alter_job(")]


def test_an_upgrade_keeps_the_jobs_and_their_state(pg: Any) -> None:
    with _databases(pg, 1) as (dsn,), psycopg.connect(dsn, autocommit=True) as conn:
        _install_17(conn)
        conn.execute("CREATE SCHEMA app; CREATE PROCEDURE app.work() LANGUAGE sql AS $$ SELECT 1 $$")
        conn.execute("SELECT radix.create_job('app.nightly', '{\"every\": \"5 minutes\"}', current_user, "
                     "'app.work', '[]')")
        before = conn.execute("SELECT job_id, status, planned_ns FROM radix.job_overview").fetchall()
        migrate.install(conn)
        assert conn.execute("SELECT job_id, status, planned_ns FROM radix.job_overview").fetchall() == before


def test_a_schema_older_than_17_is_refused(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(migrate.read_sql("bootstrap.sql"))
        conn.execute("INSERT INTO radix.schema_migrations (version, name) VALUES (16, 'old')")
        with pytest.raises(SchemaError, match="at version 16; this radixjobs upgrades version 17 or newer"):
            migrate.install(conn)


def test_routines_of_another_version_are_not_ready_until_installed(conn: psycopg.Connection[Any]) -> None:
    conn.execute("UPDATE radix.routine_source SET checksum = 'another'")
    with pytest.raises(SchemaError, match=r"routines in database .* are not this radixjobs' own"):
        migrate.check_ready(conn)
    assert migrate.install(conn) == []
    migrate.check_ready(conn)


def test_an_install_restores_the_routines_and_keeps_an_operators_trigger(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE OR REPLACE FUNCTION radix.max_timeout_ms() RETURNS integer LANGUAGE sql RETURN 1")
    conn.execute("CREATE FUNCTION radix.stray() RETURNS integer LANGUAGE sql RETURN 1")
    conn.execute("CREATE VIEW radix.stray_view AS SELECT 1 AS one")
    conn.execute("CREATE TRIGGER stray AFTER INSERT ON radix.nodes FOR EACH ROW EXECUTE FUNCTION radix._job_dropped()")
    conn.execute("CREATE SCHEMA audit; CREATE FUNCTION audit.copy() RETURNS trigger LANGUAGE plpgsql "
                 "AS $$ BEGIN RETURN NULL; END $$")
    conn.execute("CREATE TRIGGER audit AFTER INSERT ON radix.radix_system_job_history "
                 "FOR EACH ROW EXECUTE FUNCTION audit.copy()")
    conn.execute("GRANT EXECUTE ON FUNCTION radix._caller(name) TO PUBLIC")
    migrate.install(conn)
    assert conn.execute("SELECT radix.max_timeout_ms()").fetchone() == (604800000,)
    assert conn.execute("SELECT to_regprocedure('radix.stray()'), to_regclass('radix.stray_view')").fetchone() \
        == (None, None)
    assert conn.execute("SELECT has_function_privilege('public', 'radix._caller(name)', 'EXECUTE')").fetchone() \
        == (False,)
    # radix's own stray trigger is gone; an operator's trigger on a radix table, running its own function, stays
    assert conn.execute("SELECT tgname FROM pg_trigger WHERE tgname IN ('stray', 'audit')").fetchall() == [("audit",)]


def test_an_install_replaces_a_routine_whose_shape_changed(conn: psycopg.Connection[Any]) -> None:
    """What CREATE OR REPLACE cannot change in place (a result type, a view's columns) is dropped first."""
    conn.execute("DROP FUNCTION radix.max_timeout_ms() CASCADE")
    conn.execute("CREATE FUNCTION radix.max_timeout_ms() RETURNS text LANGUAGE sql RETURN 'x'")
    conn.execute("DROP VIEW radix.node_overview")
    conn.execute("CREATE VIEW radix.node_overview AS SELECT 1 AS other")
    migrate.install(conn)
    assert conn.execute("SELECT radix.max_timeout_ms()").fetchone() == (604800000,)
    assert conn.execute("SELECT count(*) FROM radix.node_overview").fetchone() == (0,)


@pytest.mark.versions
def test_every_routine_with_settings_pins_jit_off(conn: psycopg.Connection[Any]) -> None:
    """Radix's statements are never JIT-compiled: a routine with a SET clause sets jit = off;
    without one are only the inlinable SQL helpers and the runners of the jobs' own CALLs."""
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, l.lanname, p.proconfig FROM pg_proc p "
        "JOIN pg_language l ON l.oid = p.prolang WHERE p.pronamespace = 'radix'::regnamespace").fetchall()
    assert rows
    assert [name for name, _, config in rows if config is not None and "jit=off" not in config] == []
    unpinned = sorted(name.split("(")[0] for name, language, config in rows if config is None and language != "sql")
    assert unpinned == ["radix.run_tick", "radix.run_ticks"]
    # the finder's helpers that one principal does not reach (test_batches.py calls the rest)
    languages = {name.split("(")[0]: language for name, language, _ in rows}
    assert {languages[f"radix.{name}"] for name in ("_claim_shares", "node_alive", "job_has_live_frame")} == {"plpgsql"}
