"""The operator's view (sql/routines/identity.sql, views.sql): who sees every job, document, attempt and node,
and that seeing is all.

An operator is a superuser, a role with the privileges (USAGE) of schema radix's owner, or of radix_admin.
Bare membership (INHERIT FALSE, SET FALSE) is no operator; an operator changes nothing it does not own;
nodes show only to operators; the schema version is readable by every role and only through its function.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

from radixjobs import documents, migrate
from tests.apps import App
from tests.support import PgCluster


@pytest.fixture
def login(pg: PgCluster, app: App) -> Iterator[Any]:
    """Connect to the app's database as a role (autocommit)."""
    opened: list[psycopg.Connection[Any]] = []
    dbname = str(psycopg.conninfo.conninfo_to_dict(app.dsn)["dbname"])

    def connect(user: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(pg.dsn_for(dbname, user=user), autocommit=True)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()


def count(conn: psycopg.Connection[Any], view: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM radix.{view}").fetchone()
    return int(row[0]) if row else -1


VIEWS = ("job_overview", "job_history", "document_overview", "node_overview")


@pytest.fixture
def catalog(app: App) -> App:
    """One job that ran once (an attempt, a node) and one document, all owned by the superuser."""
    name = app.job("CREATE JOB app.tick SCHEDULE AT TIMESTAMP '2020-01-01T00:00:00Z' RUN AS {p} "
                   "CALL app.record('tick')")
    app.run()
    assert app.history(name)
    app.conn.execute("CREATE FUNCTION app.noop() RETURNS void LANGUAGE sql AS 'SELECT 1'")
    documents.apply(app.conn, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
        "NUM": 77, "DB_FUNCTION": "app.noop", "RUN_AS": app.principal, "INTERVAL": "now() + interval '1 hour'"}})
    return app


def test_only_inherited_radix_admin_membership_opens_the_view(catalog: App, roles: Any, login: Any) -> None:
    ident = sql.Identifier
    member, bare, setter = roles("member"), roles("bare"), roles("setter")
    catalog.conn.execute(sql.SQL("GRANT radix_admin TO {}").format(ident(member)))
    catalog.conn.execute(sql.SQL("GRANT radix_admin TO {} WITH INHERIT FALSE, SET FALSE").format(ident(bare)))
    catalog.conn.execute(sql.SQL("GRANT radix_admin TO {} WITH INHERIT FALSE, SET TRUE").format(ident(setter)))
    as_member, as_bare, as_setter = login(member), login(bare), login(setter)
    for view in VIEWS:
        assert count(as_member, view) >= 1, view
        assert count(as_bare, view) == 0, view
        assert count(as_setter, view) == 0, view
    as_setter.execute("SET ROLE radix_admin")  # PostgreSQL's rule: SET ROLE gives the role's privileges
    assert count(as_setter, "job_overview") == 1
    # the principal (a LOGIN tenant owning nothing here) sees none of the superuser's objects
    tenant = login(catalog.principal)
    assert [count(tenant, view) for view in VIEWS] == [0, 0, 0, 0]


def test_the_operator_view_is_read_only(catalog: App, roles: Any, login: Any) -> None:
    admin = roles("admin")
    catalog.conn.execute(sql.SQL("GRANT radix_admin TO {}").format(sql.Identifier(admin)))
    conn = login(admin)
    refusals = [
        ("SELECT radix.alter_job('app.tick', false)", "must be owner of job"),
        ("SELECT radix.drop_job('app.tick', false, false)", "must be owner of job"),
        ("UPDATE radix.radix_system_job_state SET status = 'disabled'", "permission denied"),
        ("DELETE FROM radix.radix_system_job_history", "permission denied"),
        ("SELECT * FROM radix.nodes", "permission denied"),
        ("SELECT * FROM radix.schema_migrations", "permission denied"),
    ]
    for statement, message in refusals:
        with pytest.raises(errors.InsufficientPrivilege, match=message):
            conn.execute(statement)
    with pytest.raises(Exception, match="belongs to another role"):
        documents.apply(conn, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
            "NUM": 77, "DB_FUNCTION": "app.noop", "RUN_AS": admin, "INTERVAL": "now() + interval '1 hour'"}})
    assert catalog.state("app.tick")["enabled"] is True


def test_the_schema_owner_is_an_operator(catalog: App, roles: Any, login: Any) -> None:
    """Whoever has the privileges of schema radix's owner (the scheduler's role) sees everything."""
    scheduler, tenant = roles("sched"), roles("tenant")
    catalog.conn.execute(sql.SQL("ALTER SCHEMA radix OWNER TO {}").format(sql.Identifier(scheduler)))
    assert count(login(scheduler), "job_overview") == 1
    assert count(login(tenant), "job_overview") == 0


def test_every_role_reads_the_version_and_only_the_version(catalog: App, roles: Any, login: Any) -> None:
    stranger = roles("stranger")
    conn = login(stranger)
    catalog.conn.execute(sql.SQL("CREATE SCHEMA evil AUTHORIZATION {}").format(sql.Identifier(stranger)))
    conn.execute("CREATE FUNCTION evil.max(integer) RETURNS integer LANGUAGE sql AS 'SELECT 999'")
    conn.execute("SET search_path = evil, pg_catalog")
    assert migrate.installed_version(conn) == migrate.code_version()
    assert conn.execute("SELECT radix.schema_version()").fetchone() == (migrate.code_version(),)
    migrate.check_ready(conn)
    with pytest.raises(errors.InsufficientPrivilege):
        conn.execute("SELECT version FROM radix.schema_migrations")
    # nodes: a count for anyone, rows only for operators
    assert conn.execute("SELECT radix.live_node_count()").fetchone() == (0,)
    assert count(conn, "node_overview") == 0
