"""The CLI as a user types it: sql, install, db start/stop/status/uri, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from radixjobs.embedded import bin_dir
from tests.acceptance.conftest import Run, run_cli


def test_sql_select_prints_table(cli: Run) -> None:
    res = cli("sql", "-c", "select 1 as one")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].strip() == "one"
    assert lines[2].strip() == "1"
    assert "(1 row)" in res.stdout


def test_sql_json_is_array_of_objects(cli: Run) -> None:
    res = cli("sql", "--json", "-c", "select 1 as one, 'x' as two union all select 2, null")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [{"one": 1, "two": "x"}, {"one": 2, "two": None}]


def test_sql_error_names_statement_and_exits_nonzero(cli: Run) -> None:
    script = "select 1;\n\nselect * from no_such_table;\nselect 3;"
    res = cli("sql", "-c", script)
    assert res.returncode != 0
    assert "statement 2 (line 3)" in res.stderr
    assert 'relation "no_such_table" does not exist' in res.stderr
    assert "Traceback" not in res.stderr
    assert "3" not in res.stdout.split("(1 row)")[-1]


def test_sql_dollar_quoted_body_is_one_statement(cli: Run, tmp_path: Path) -> None:
    script = tmp_path / "p.sql"
    script.write_text(
        "create table t(x int);\n"
        "create procedure p() language plpgsql as $$\nbegin\n  insert into t values (1);\n"
        "  insert into t values (2);\nend;\n$$;\n"
        "call p();\nselect count(*) as n from t;\n")
    res = cli("sql", "--json", "-f", str(script))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [{"n": 2}]


def test_sql_reads_stdin(cli: Run) -> None:
    res = cli("sql", "--json", input="select 41 + 1 as answer;")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [{"answer": 42}]


def test_install_twice(cli: Run) -> None:
    first = cli("install", "--json")
    assert first.returncode == 0, first.stderr
    second = cli("install")
    assert second.returncode == 0, second.stderr
    assert "nothing to do" in second.stdout


def test_external_dsn_without_schema_runs_plain_sql_and_asks_for_install_for_job_ddl(empty_db: str) -> None:
    env = {"RADIXJOBS_DSN": empty_db}
    plain = run_cli("sql", "-c", "CREATE SCHEMA app", "-c", "select 1 as one", env=env)
    assert plain.returncode == 0, plain.stderr  # plain SQL needs no radix schema (the setup before install)
    job = "CREATE JOB app.j SCHEDULE EVERY INTERVAL '1 hour' RUN AS current_user CALL app.p()"
    res = run_cli("sql", "-c", "CREATE TABLE app.t ()", "-c", job, env=env)
    assert res.returncode != 0
    assert "run `radixjobs install`" in res.stderr
    assert run_cli("sql", "-c", "select count(*) from pg_tables where schemaname = 'app'", env=env).stdout \
        .splitlines()[2].strip() == "0"  # refused before its first statement ran
    assert run_cli("install", env=env).returncode == 0
    assert run_cli("sql", "-c", "select 1", env=env).returncode == 0


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (["sql", "-c", "select 1"], {"RADIXJOBS_DSN": "host=/nonexistent/socket dbname=x"}, "cannot connect"),
        (["sql", "-c", "select 1"], {"RADIXJOBS_DSN": "this is not a dsn"}, "invalid DSN"),
        (["sql", "--no-such-option"], {}, "No such option"),
        (["no-such-command"], {}, "No such command"),
    ],
)
def test_user_errors_are_one_line(args: list[str], env: dict[str, str], fragment: str) -> None:
    res = run_cli(*args, env=env)
    assert res.returncode != 0
    assert fragment in res.stderr
    assert "Traceback" not in res.stderr


def test_embedded_lifecycle(cli_home: Path) -> None:
    home = str(cli_home)
    assert run_cli("db", "status", "--home", home).returncode == 3
    started = run_cli("db", "start", "--home", home, "--json")
    assert started.returncode == 0, started.stderr
    uri = json.loads(started.stdout)["uri"]
    again = run_cli("db", "start", "--home", home, "--json")
    assert json.loads(again.stdout)["state"] == "already running"
    # psql accepts the printed URI
    printed = run_cli("db", "uri", "--home", home).stdout.strip()
    assert printed == uri
    psql = subprocess.run([str(bin_dir() / "psql"), printed, "-Atc", "select 1"], capture_output=True, text=True)
    assert psql.stdout.strip() == "1", psql.stderr
    # a server found running is left alone
    assert run_cli("sql", "--home", home, "-c", "select 1").returncode == 0
    assert run_cli("db", "status", "--home", home).returncode == 0
    assert run_cli("db", "stop", "--home", home).returncode == 0
    assert run_cli("db", "status", "--home", home).returncode == 3


def test_server_started_on_demand_is_stopped_at_exit(cli_home: Path) -> None:
    res = run_cli("sql", "--home", str(cli_home), "--json", "-c", "select count(*) as n from radix.schema_migrations")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)[0]["n"] >= 1
    assert run_cli("db", "status", "--home", str(cli_home)).returncode == 3


def test_concurrent_commands_share_one_server(cli_home: Path) -> None:
    home = str(cli_home)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(
            lambda _: run_cli("sql", "--home", home, "--json", "-c", "select pg_postmaster_start_time()::text as t"),
            range(4)))
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert run_cli("db", "status", "--home", home).returncode == 3
    # the data directory is intact: a later start works
    assert run_cli("db", "start", "--home", home).returncode == 0


def test_module_entry_point_version() -> None:
    res = subprocess.run([sys.executable, "-m", "radixjobs", "--version"], capture_output=True, text=True)
    assert res.returncode == 0
    assert "version" in res.stdout
