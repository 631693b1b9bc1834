"""Attacks on ``radixjobs import pg-cron`` run by a superuser: through a pg_cron job's arguments, and through the
schema the import writes its wrappers to. The import runs as the operator would run it: the CLI as a
subprocess, with a superuser's DSN; the attackers are roles made here, on their own connections.

Each imported job is admitted exactly as its pg_cron user's own CREATE JOB: on a session logged in as that user,
with its rights; and the import creates its objects fresh, in a schema of its own.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import psycopg
import pytest
from psycopg import sql

from radixjobs import catalog
from radixjobs.imports import import_pg_cron, pg_cron_session
from tests.acceptance.conftest import run_cli
from tests.apps import App
from tests.external import SUPERUSER, ExternalDb
from tests.integration.test_pg_cron_import import by_id, make_cron, owners, schema_privileges
from tests.support import wait_for


def _import(dsn: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("--dsn", dsn, "import", "pg-cron", *args, env=env)


def _rows(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    return {row["jobname"]: row for row in json.loads(done.stdout)}


def _superuser(app: App) -> str:
    row = app.conn.execute("SELECT current_user::text").fetchone()
    assert row is not None
    return str(row[0])


def _exec(conn: psycopg.Connection[Any], template: str, *names: str) -> None:
    conn.execute(sql.SQL(template).format(*(sql.Identifier(n) for n in names)))  # type: ignore[arg-type]


# A domain whose CHECK calls its owner's function: any conversion of a value to it runs that function, with
# the rights of whoever converts. The function counts its calls, and those made with a superuser's rights,
# in sequences (nextval is not undone by a rollback, as a program run by COPY … TO PROGRAM would not be),
# and tries to make its owner SUPERUSER.
CONVERSION_TRAP = """
CREATE SEQUENCE atk.calls;
CREATE SEQUENCE atk.privileged_calls;
CREATE FUNCTION atk.chk(v text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM pg_catalog.nextval('atk.calls');
    IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
        PERFORM pg_catalog.nextval('atk.privileged_calls');
    END IF;
    BEGIN
        EXECUTE pg_catalog.format('ALTER ROLE %I SUPERUSER', {attacker});
    EXCEPTION WHEN insufficient_privilege THEN NULL;
    END;
    RETURN true;
END $f$;
CREATE DOMAIN atk.d AS text CHECK (atk.chk(VALUE));
CREATE PROCEDURE atk.p(x atk.d) LANGUAGE plpgsql AS $f$ BEGIN NULL; END $f$;
"""


def _calls(app: App) -> tuple[int, bool]:
    """(calls of the trap, whether it was ever called with a superuser's rights)."""
    row = app.conn.execute("SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM atk.calls), "
                           "(SELECT is_called FROM atk.privileged_calls)").fetchone()
    assert row is not None
    return int(row[0]), bool(row[1])


def test_the_arguments_of_an_imported_call_are_converted_as_the_pg_cron_user(app: App, roles: Any,
                                                                              login: Any) -> None:
    attacker = roles("atk")
    _exec(app.conn, "CREATE SCHEMA atk AUTHORIZATION {}", attacker)
    login(attacker).execute(CONVERSION_TRAP.format(attacker=sql.quote(attacker)).encode())
    make_cron(app.conn, [{"schedule": "0 3 * * *", "command": "CALL atk.p('hello')", "username": attacker,
                          "jobname": "innocent"}])

    planned = _import(app.dsn, "--dry-run", "--json")
    assert planned.returncode == 0, planned.stderr
    assert _rows(planned)["innocent"]["action"] == "would create"
    assert _calls(app)[0] > 0  # admitted: the conversion ran, as the attacker

    done = _import(app.dsn, "--json")
    assert done.returncode == 0, done.stderr
    assert _rows(done)["innocent"]["action"] == "created"
    calls, privileged = _calls(app)
    assert calls > 0
    assert not privileged  # never with the importer's rights, not even in the dry run
    assert app.conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (attacker,)).fetchone() == (False,)
    job = catalog.get_job(app.conn, "cron_import.innocent")
    assert job is not None
    assert (job["owner"], job["principal"], job["procedure"]) == (attacker, attacker, "atk.p(atk.d)")


WRAPPER = "CREATE PROCEDURE cron_import.{} LANGUAGE plpgsql AS $f$ BEGIN RAISE NOTICE 'squatted'; END $f$"


def _source(app: App, name: str) -> tuple[str, str] | None:
    row = app.conn.execute("SELECT pg_get_userbyid(proowner)::text, prosrc FROM pg_proc "
                           "WHERE pronamespace = 'cron_import'::regnamespace AND proname = %s", (name,)).fetchone()
    return (row[0], row[1]) if row else None


def test_a_squatted_import_schema_is_refused(app: App, roles: Any, login: Any) -> None:
    """A role with CREATE on the database makes the import's schema first, with a procedure named like the
    wrapper of the superuser's pg_cron job and the comment an import writes: the import refuses the schema."""
    squatter = roles("squatter")
    _exec(app.conn, "GRANT CREATE ON DATABASE {} TO {}", app.conn.info.dbname, squatter)
    conn = login(squatter)
    conn.execute("CREATE SCHEMA cron_import")
    conn.execute(WRAPPER.format("nightly()"))
    conn.execute("COMMENT ON PROCEDURE cron_import.nightly() IS 'radixjobs: imported from pg_cron job 1 (nightly)'")
    make_cron(app.conn, [{"schedule": "0 3 * * *", "command": "ANALYZE", "username": _superuser(app),
                          "jobname": "nightly"}])
    squatted = _source(app, "nightly")
    for args in (("--dry-run",), ()):
        done = _import(app.dsn, *args)
        assert done.returncode == 1, done.stdout
        assert done.stderr == (f"radixjobs: error: schema cron_import exists and is owned by role {squatter}, "
                               "not by you: the import creates its jobs and wrappers only in a schema it made or "
                               "you own, so that no other role's objects are in the way; pass another --schema "
                               "(or, once you trust what is in it, ALTER SCHEMA … OWNER TO you)\n")
    assert catalog.list_jobs(app.conn) == []
    assert _source(app, "nightly") == squatted
    assert squatted is not None
    assert squatted[0] == squatter


def test_a_squatter_in_the_import_schema_is_named_and_never_reused(app: App, roles: Any, login: Any) -> None:
    """The schema is the operator's, but a role may create in it: it makes the wrapper of one of the superuser's
    pg_cron jobs, an overload named like another's, and a job named like a third. Each is refused, naming the
    squatter; nothing of the squatter's is reused or changed; the superuser's other job is imported."""
    squatter = roles("squatter")
    superuser = _superuser(app)
    _exec(app.conn, "CREATE SCHEMA cron_import; GRANT USAGE, CREATE ON SCHEMA cron_import TO {}", squatter)
    conn = login(squatter)
    conn.execute(WRAPPER.format("nightly()"))
    conn.execute(WRAPPER.format("hourly(n int DEFAULT 0)"))
    conn.execute(WRAPPER.format("mine()"))
    catalog.execute_job_ddl(conn, f"CREATE JOB cron_import.report SCHEDULE EVERY INTERVAL '1 hour' RUN AS "
                                  f"{squatter} CALL cron_import.mine()")
    make_cron(app.conn, [
        {"schedule": "0 3 * * *", "command": "ANALYZE", "username": superuser, "jobname": "nightly"},
        {"schedule": "0 * * * *", "command": "ANALYZE", "username": superuser, "jobname": "hourly"},
        {"schedule": "0 4 * * *", "command": "ANALYZE", "username": superuser, "jobname": "report"},
        {"schedule": "0 5 * * *", "command": "ANALYZE", "username": superuser, "jobname": "clean"},
    ])
    before = {name: _source(app, name) for name in ("nightly", "hourly", "mine")}

    done = _import(app.dsn, "--json")
    assert done.returncode == 1, done.stderr
    rows = _rows(done)
    assert {name: row["action"] for name, row in rows.items()} == {
        "nightly": "refused", "hourly": "refused", "report": "refused", "clean": "created"}
    assert rows["nightly"]["reason"].startswith(f"routine cron_import.nightly() exists, owned by role {squatter}: ")
    assert rows["hourly"]["reason"].startswith(
        f"routine cron_import.hourly(integer) exists, owned by role {squatter}: ")
    assert rows["report"]["reason"].startswith(
        f"a job of this name exists, RUN AS {squatter} (owner {squatter}), not as {superuser}: ")
    assert {name: _source(app, name) for name in ("nightly", "hourly", "mine")} == before
    assert [(j["name"], j["owner"], j["principal"]) for j in catalog.list_jobs(app.conn)] == [
        ("cron_import.clean", superuser, superuser), ("cron_import.report", squatter, squatter)]
    assert owners(app.conn, "cron_import")["clean"] == superuser


STUBBORN = """
CREATE FUNCTION atk.chk(v text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    LOOP
        BEGIN PERFORM pg_catalog.pg_sleep(10); EXCEPTION WHEN query_canceled THEN NULL; END;
    END LOOP;
END $f$;
CREATE DOMAIN atk.d AS text CHECK (atk.chk(VALUE));
CREATE PROCEDURE atk.p(x atk.d) LANGUAGE plpgsql AS $f$ BEGIN NULL; END $f$;
"""


def test_a_conversion_that_never_ends_cannot_hold_the_import(app: App, roles: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The pg_cron user's conversion catches every cancel: its session is cut off, its job refused, and the
    import goes on with the next user's."""
    attacker = roles("atk")
    _exec(app.conn, "CREATE SCHEMA atk AUTHORIZATION {}", attacker)
    with psycopg.connect(app.dsn, user=attacker, autocommit=True) as conn:
        conn.execute(STUBBORN.encode())
    make_cron(app.conn, [
        {"schedule": "0 3 * * *", "command": "CALL atk.p('x')", "username": attacker, "jobname": "stuck"},
        {"schedule": "0 3 * * *", "command": "CALL app.record('fine')", "username": app.principal,
         "jobname": "fine"},
    ])
    monkeypatch.setattr(pg_cron_session, "STATEMENT_TIMEOUT_MS", 200)
    monkeypatch.setattr(pg_cron_session, "WATCHDOG_S", 2.0)
    outcomes = by_id(import_pg_cron(app.conn))
    assert (outcomes[1].action, outcomes[2].action) == ("refused", "created")
    assert outcomes[1].reason == f"admission as {attacker} did not finish within 2 s; its session was closed"
    wait_for(lambda: app.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND "
                                      "application_name = 'radixjobs-import'", (attacker,)).fetchone() == (0,),
             message="the cut session's backend ends")
    assert [j["name"] for j in catalog.list_jobs(app.conn)] == ["cron_import.fine"]


# -- the password file -------------------------------------------------------------------------------------



def test_the_importers_password_never_logs_a_pg_cron_user_in(ext: ExternalDb) -> None:
    """On a cluster with scram passwords: a pg_cron user whose password is the importing superuser's, not in the
    password file, is reported as unmapped; one in the password file gets its job; the superuser's own job is
    made on the superuser's own connection."""
    twin = ext.role("twin", in_passfile=False)
    listed = ext.role("listed")
    with ext.admin() as conn:
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
            sql.Identifier(twin), sql.Literal(ext.cluster.passwords[SUPERUSER])))
        make_cron(conn, [
            {"schedule": "0 3 * * *", "command": "ANALYZE", "username": twin, "jobname": "twin"},
            {"schedule": "0 3 * * *", "command": "ANALYZE", "username": listed, "jobname": "listed"},
            {"schedule": "0 3 * * *", "command": "ANALYZE", "username": SUPERUSER, "jobname": "admin"},
        ])
    done = _import(ext.dsn(SUPERUSER), "--json", env=ext.env())
    assert done.returncode == 1, done.stderr
    rows = _rows(done)
    assert {name: row["action"] for name, row in rows.items()} == {
        "twin": "unmapped", "listed": "created", "admin": "created"}
    assert rows["twin"]["reason"].startswith(f"cannot log in as role {twin}: ")
    assert "no password supplied" in rows["twin"]["reason"]
    with ext.admin() as conn:
        assert owners(conn, "cron_import") == {"listed": listed, "admin": SUPERUSER}
        assert schema_privileges(conn, twin, "cron_import") == (False, False)
