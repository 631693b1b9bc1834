"""pg_cron import against a real PostgreSQL with a ``cron.job`` table in pg_cron's shape (no extension)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from radixjobs import catalog
from radixjobs.errors import RadixError
from radixjobs.imports import import_pg_cron
from radixjobs.imports.pg_cron import Outcome
from tests.apps import App
from tests.support import PgCluster

CRON_SHAPE = """
CREATE SCHEMA cron;
CREATE TABLE cron.job (
    jobid bigserial PRIMARY KEY, schedule text NOT NULL, command text NOT NULL,
    nodename text NOT NULL DEFAULT 'localhost', nodeport int NOT NULL DEFAULT current_setting('port')::int,
    database text NOT NULL DEFAULT current_database(), username text NOT NULL DEFAULT current_user,
    active boolean NOT NULL DEFAULT true, jobname text);
"""


def make_cron(conn: psycopg.Connection[Any], rows: list[dict[str, Any]]) -> None:
    """pg_cron's table, and one row per dict (columns as given, the rest pg_cron's defaults)."""
    conn.execute(CRON_SHAPE.encode())
    for row in rows:
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in row)
        values = sql.SQL(", ").join(sql.Placeholder() for _ in row)
        conn.execute(sql.SQL("INSERT INTO cron.job ({}) VALUES ({})").format(columns, values), list(row.values()))


def by_id(outcomes: list[Outcome]) -> dict[int, Outcome]:
    return {o.jobid: o for o in outcomes}


def procedures(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s ORDER BY 1", (schema,)).fetchall()]


def owners(conn: psycopg.Connection[Any], schema: str) -> dict[str, str]:
    """Each routine of ``schema`` and its owner."""
    return dict(conn.execute(
        "SELECT p.proname::text, pg_get_userbyid(p.proowner)::text FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s", (schema,)).fetchall())


def schema_privileges(conn: psycopg.Connection[Any], role: str, schema: str) -> tuple[bool, bool]:
    """(USAGE, CREATE) of ``role`` on ``schema``."""
    row = conn.execute("SELECT has_schema_privilege(%s, %s, 'USAGE'), has_schema_privilege(%s, %s, 'CREATE')",
                       (role, schema, role, schema)).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


def make_cron_due(app: App, name: str) -> None:
    """A CRON job enabled two days ago and due now: the engine plans its latest tick."""
    app.conn.execute("UPDATE radix.radix_system_job_state SET anchor_ns = radix.to_ns(clock_timestamp()) - %s, "
                     "due_ns = radix.to_ns(clock_timestamp()) WHERE job_id = %s",
                     (2 * 86_400 * 10**9, app.state(name)["job_id"]))


def mixed_rows(principal: str) -> list[dict[str, Any]]:
    return [
        {"schedule": "0 3 * * *", "command": "CALL app.record('nightly');", "username": principal,
         "jobname": "Nightly Record"},                                                      # 1 CALL
        {"schedule": "30 seconds", "command": "INSERT INTO app.effects (tag) VALUES ('a'); "
                                              "SELECT count(*), $$x$cmd$y$$ FROM app.effects -- done",
         "username": principal, "jobname": "every-30s"},                                    # 2 wrapped
        {"schedule": "@hourly", "command": "BEGIN; CALL app.record(now()::text); COMMIT;",
         "username": principal},                                                            # 3 envelope
        {"schedule": "0 4 * * *", "command": "VACUUM app.effects", "username": principal,
         "jobname": "vac"},                                                                 # 4 VACUUM
        {"schedule": "0 0 $ * *", "command": "SELECT 1", "username": principal, "jobname": "eom"},  # 5 $
        {"schedule": "* * * * *", "command": "SELECT 1", "username": principal, "jobname": "there",
         "database": "somewhere_else"},                                                     # 6 other db
        {"schedule": "* * * * *", "command": "SELECT 1", "username": principal, "jobname": "remote",
         "nodename": "db2.internal"},                                                       # 7 other node
        {"schedule": "*/5 * * * *", "command": "CALL app.record('off')", "username": principal,
         "jobname": "paused", "active": False},                                             # 8 inactive
    ]


def test_import_maps_each_row_and_the_jobs_run(app: App) -> None:
    make_cron(app.conn, mixed_rows(app.principal))
    outcomes = by_id(import_pg_cron(app.conn))
    assert {i: o.action for i, o in outcomes.items()} == {
        1: "created", 2: "created", 3: "created", 4: "unmapped", 5: "unmapped", 6: "skipped", 7: "skipped",
        8: "created"}
    assert outcomes[1].job == "cron_import.nightly_record"
    assert outcomes[2].job == "cron_import.every_30s"
    assert outcomes[3].job == "cron_import.pg_cron_3"
    assert "VACUUM" in outcomes[4].reason
    assert "'$'" in outcomes[5].reason
    assert "somewhere_else" in outcomes[6].reason
    assert "db2.internal" in outcomes[7].reason

    nightly = app.state("cron_import.nightly_record")
    assert (nightly["schedule"], nightly["principal"], nightly["procedure"]) == (
        "CRON '0 3 * * *' TIME ZONE 'UTC'", app.principal, "app.record(text)")
    every = app.state("cron_import.every_30s")
    assert every["schedule"].startswith("EVERY 00:00:30")
    assert every["procedure"] == "cron_import.every_30s()"
    hourly = app.state("cron_import.pg_cron_3")
    assert hourly["schedule"] == "CRON '0 * * * *' TIME ZONE 'UTC'"
    assert (app.state("cron_import.paused")["enabled"], nightly["enabled"]) == (False, True)
    # pg_cron ran each job in its own transaction: imported jobs take the default options (batch = off)
    assert (nightly["batch_ticks"], every["batch_ticks"], hourly["batch_ticks"]) == (False, False, False)
    # the pg_cron user made its jobs and its wrappers, in the importer's schema
    assert {app.state(o.job)["owner"] for o in outcomes.values() if o.action == "created" and o.job} == {
        app.principal}
    assert owners(app.conn, "cron_import") == {"every_30s": app.principal, "pg_cron_3": app.principal}
    (acl,) = app.conn.execute("SELECT proacl::text[] FROM pg_proc WHERE proname = 'every_30s'").fetchone() or ()
    assert acl == [f"{app.principal}=X/{app.principal}"]  # not PUBLIC
    assert app.conn.execute("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'cron_import'"
                            ).fetchone() == ("postgres",)
    assert schema_privileges(app.conn, app.principal, "cron_import") == (True, False)  # CREATE: the import's only

    app.make_due("cron_import.every_30s")
    for name in ("cron_import.nightly_record", "cron_import.pg_cron_3"):  # CRON: planned by the engine
        make_cron_due(app, name)
    assert app.run().counters["successes"] == 3
    tags = sorted(str(tag) for (tag,) in app.conn.execute("SELECT tag FROM app.effects").fetchall())
    assert tags[1:] == ["a", "nightly"]  # and the envelope job's now()::text, which sorts first
    assert len(tags) == 3
    for name in ("cron_import.nightly_record", "cron_import.every_30s", "cron_import.pg_cron_3"):
        assert [h["status"] for h in app.history(name)] == ["succeeded"], name
    who = app.conn.execute("SELECT DISTINCT who FROM app.effects WHERE who IS NOT NULL").fetchall()
    assert who == [(app.principal,)]


def test_dry_run_writes_nothing_and_repeat_is_idempotent(app: App) -> None:
    make_cron(app.conn, mixed_rows(app.principal))
    planned = by_id(import_pg_cron(app.conn, dry_run=True, schema="imported"))
    assert [i for i, o in planned.items() if o.action == "would create"] == [1, 2, 3, 8]
    assert f"admitted in {app.principal}'s temporary schema: imported is missing" in planned[2].reason
    assert app.conn.execute("SELECT to_regnamespace('imported')").fetchone() == (None,)
    assert catalog.list_jobs(app.conn) == []

    first = by_id(import_pg_cron(app.conn, schema="imported"))
    assert [i for i, o in first.items() if o.action == "created"] == [1, 2, 3, 8]
    before = app.conn.execute("SELECT count(*) FROM radix.job_overview").fetchone()
    again = by_id(import_pg_cron(app.conn, schema="imported"))
    assert [i for i, o in again.items() if o.action == "exists"] == [1, 2, 3, 8]
    assert {again[i].action for i in (4, 5, 6, 7)} == {"unmapped", "skipped"}
    assert app.conn.execute("SELECT count(*) FROM radix.job_overview").fetchone() == before
    assert procedures(app.conn, "imported") == ["every_30s", "pg_cron_3"]

    # a dropped job leaves its wrapper, which is never reused: the import names it, until it is dropped too
    catalog.drop_job(app.conn, "imported.every_30s")
    refused = by_id(import_pg_cron(app.conn, schema="imported"))[2]
    assert refused.action == "refused"
    assert refused.reason.startswith(f"routine imported.every_30s() exists, owned by role {app.principal}: ")
    app.conn.execute("DROP PROCEDURE imported.every_30s()")
    assert by_id(import_pg_cron(app.conn, schema="imported", dry_run=True))[2].action == "would create"
    assert by_id(import_pg_cron(app.conn, schema="imported"))[2].action == "created"


def test_other_database_imported_with_database_option(app: App) -> None:
    make_cron(app.conn, mixed_rows(app.principal)[5:6])
    (outcome,) = import_pg_cron(app.conn, database="somewhere_else")
    assert outcome.action == "created"
    assert app.state("cron_import.there")["principal"] == app.principal


def test_each_job_is_created_by_its_user_or_says_why(app: App, pg: PgCluster, roles: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-superuser importer: its own rows on its own connection; others' on sessions logged in as them."""
    importer = roles("importer")
    stranger = roles("stranger")
    locked = roles("locked", "NOLOGIN")
    dbname = app.conn.info.dbname
    app.conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(dbname),
                                                                        sql.Identifier(importer)))
    make_cron(app.conn, [
        {"schedule": "* * * * *", "command": "SELECT 1", "username": stranger, "jobname": "theirs"},
        {"schedule": "5 seconds", "command": "SELECT 2", "username": importer, "jobname": "mine"},
        {"schedule": "* * * * *", "command": "SELECT 3", "username": "no_such_role_xyz", "jobname": "ghost"},
        {"schedule": "* * * * *", "command": "SELECT 4", "username": locked, "jobname": "locked"},
    ])
    app.conn.execute(sql.SQL("GRANT USAGE ON SCHEMA cron TO {0}; GRANT SELECT ON cron.job TO {0}; "
                             "CREATE SCHEMA cron_import AUTHORIZATION {0}").format(sql.Identifier(importer)))
    # another transaction is creating a job of the stranger's job's name: its admission waits, then gives up
    # after its wrapper was made, which goes with it
    monkeypatch.setenv("RADIXJOBS_LOCK_TIMEOUT", "0.5")
    with psycopg.connect(app.dsn, autocommit=True) as blocker, blocker.transaction() as tx:
        catalog.execute_job_ddl(blocker, f"CREATE JOB cron_import.theirs SCHEDULE EVERY INTERVAL '1 hour' "
                                         f"RUN AS {app.principal} CALL app.record('b')")
        with psycopg.connect(pg.dsn_for(dbname, user=importer), autocommit=True) as conn:
            outcomes = by_id(import_pg_cron(conn))
        raise psycopg.Rollback(tx)
    assert [o.action for o in outcomes.values()] == ["refused", "created", "unmapped", "unmapped"]
    assert "is being created or changed by another transaction" in outcomes[1].reason
    assert outcomes[3].reason.startswith("cannot log in as role no_such_role_xyz: ")
    assert 'role "no_such_role_xyz" does not exist' in outcomes[3].reason
    assert outcomes[4].reason.startswith(f"cannot log in as role {locked}: ")
    assert "not permitted to log in" in outcomes[4].reason
    assert owners(app.conn, "cron_import") == {"mine": importer}
    assert [(j["name"], j["owner"]) for j in catalog.list_jobs(app.conn)] == [("cron_import.mine", importer)]
    # what the import granted the stranger for its attempt is taken back
    assert schema_privileges(app.conn, stranger, "cron_import") == (False, False)

    # again, unblocked: the stranger's job is made; and then seen by the stranger's session (the importer, no
    # operator, sees only its own jobs), so a third import leaves it alone
    for expected in (["created", "exists"], ["exists", "exists"]):
        with psycopg.connect(pg.dsn_for(dbname, user=importer), autocommit=True) as conn:
            outcomes = by_id(import_pg_cron(conn))
        assert [outcomes[1].action, outcomes[2].action] == expected
    assert [(j["name"], j["owner"]) for j in catalog.list_jobs(app.conn)] == [
        ("cron_import.mine", importer), ("cron_import.theirs", stranger)]
    assert schema_privileges(app.conn, stranger, "cron_import") == (True, False)


def test_wrapper_of_someone_else_is_not_replaced(app: App) -> None:
    app.conn.execute("CREATE SCHEMA imported; CREATE PROCEDURE imported.mine(n int DEFAULT 1) LANGUAGE sql "
                     "AS 'SELECT 1'")
    make_cron(app.conn, [{"schedule": "* * * * *", "command": "SELECT 2", "username": app.principal,
                          "jobname": "mine"}])
    (outcome,) = import_pg_cron(app.conn, schema="imported")
    assert outcome.action == "refused"
    assert outcome.reason.startswith("routine imported.mine(integer) exists, owned by role postgres: ")
    assert catalog.list_jobs(app.conn) == []
    assert procedures(app.conn, "imported") == ["mine"]


def test_no_cron_schema_is_one_clear_error(app: App) -> None:
    with pytest.raises(RadixError, match=r"no pg_cron here: database \S+ has no table cron.job"):
        import_pg_cron(app.conn)


def test_cron_time_zone_comes_from_pg_crons_setting(app: App) -> None:
    make_cron(app.conn, [{"schedule": "0 3 * * *", "command": "SELECT 1", "username": app.principal,
                          "jobname": "berlin"}])
    app.conn.execute("SET cron.timezone = 'Europe/Berlin'")  # as pg_cron's GUC would be, where it is loaded
    (outcome,) = import_pg_cron(app.conn)
    assert outcome.action == "created"
    assert app.state("cron_import.berlin")["schedule"] == "CRON '0 3 * * *' TIME ZONE 'Europe/Berlin'"
