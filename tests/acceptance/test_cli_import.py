"""``radixjobs import pg-cron`` as a subprocess: table, --json, dry run, exit codes, --cron-dsn, errors."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from tests.acceptance.conftest import Run
from tests.integration.test_pg_cron_import import make_cron


def test_import_table_json_and_exit_codes(cli: Run, db: str, roles: Any) -> None:
    worker = roles("worker")
    missing = cli("import", "pg-cron")
    assert missing.returncode == 1
    assert missing.stderr.startswith("radixjobs: error: no pg_cron here: database ")
    assert len(missing.stderr.strip().splitlines()) == 1

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA app; CREATE PROCEDURE app.tidy(n int) LANGUAGE sql AS 'SELECT n'")
        conn.execute(f"GRANT USAGE ON SCHEMA app TO {worker}")
        make_cron(conn, [
            {"schedule": "15 2 * * *", "command": "CALL app.tidy(7)", "username": worker, "jobname": "tidy"},
            {"schedule": "@weekly", "command": "VACUUM FULL", "username": worker, "jobname": "vacuum"},
        ])

    planned = cli("import", "pg-cron", "--dry-run")
    assert planned.returncode == 1, planned.stderr  # one row cannot be mapped
    header = planned.stdout.splitlines()[0]
    for column in ("pg_cron jobid", "jobname", "radixjobs job", "action", "reason"):
        assert column in header
    assert "would create" in planned.stdout
    assert "CALL app.tidy(7)" in planned.stdout
    assert "dry run, nothing written: 1 would create, 1 unmapped" in planned.stdout
    assert json.loads(cli("jobs", "list", "--json").stdout) == []

    done = cli("import", "pg-cron", "--json", "--timeout", "2 hours")
    assert done.returncode == 1
    rows = {r["jobname"]: r for r in json.loads(done.stdout)}
    assert (rows["tidy"]["action"], rows["tidy"]["job"]) == ("created", "cron_import.tidy")
    assert rows["vacuum"]["action"] == "unmapped"
    shown = json.loads(cli("jobs", "show", "cron_import.tidy", "--json").stdout)
    assert (shown["principal"], shown["deadline_ms"]) == (worker, 7_200_000)

    again = cli("import", "pg-cron", "--json")
    assert [r["action"] for r in json.loads(again.stdout)] == ["exists", "unmapped"]

    bad = cli("import", "pg-cron", "--schema", "pg_mine")
    assert bad.returncode != 0
    assert "reserved" in bad.stderr
    assert "Traceback" not in bad.stderr + missing.stderr


def test_cron_dsn_reads_pg_crons_own_database(cli: Run, db: str, empty_db: str, roles: Any) -> None:
    worker = roles("worker")
    with psycopg.connect(db, autocommit=True) as conn:
        target = conn.info.dbname
    with psycopg.connect(empty_db, autocommit=True) as conn:
        make_cron(conn, [
            {"schedule": "10 seconds", "command": "SELECT 1", "username": worker, "jobname": "here",
             "database": target},
            {"schedule": "10 seconds", "command": "SELECT 1", "username": worker, "jobname": "cron_db_itself"},
        ])
    res = cli("import", "pg-cron", "--cron-dsn", empty_db, "--schema", "moved", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert [(r["job"], r["action"]) for r in json.loads(res.stdout)] == [
        ("moved.here", "created"), ("moved.cron_db_itself", "skipped")]
