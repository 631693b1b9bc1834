"""Defects found in real deployments (issue #12), each through the real command or daemon.

An owner that fails on a non-connection error is logged, counted in /status and restarted; an explicit flag
wins over the environment; bad input is a one-line error, never a traceback; ``sql -c`` repeats as in
psql; ``status --http`` is checked; one daemon is one live node.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg

from tests.acceptance.conftest import Run, run_cli
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.support import wait_for

BREAK_NEXT_DUE_IN = """
ALTER FUNCTION radix.next_due_in(integer, integer) RENAME TO next_due_in_saved;
CREATE FUNCTION radix.next_due_in(integer, integer) RETURNS float8 LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'provoked by the test'; END $$;
"""
MEND_NEXT_DUE_IN = """
DROP FUNCTION radix.next_due_in(integer, integer);
ALTER FUNCTION radix.next_due_in_saved(integer, integer) RENAME TO next_due_in;
"""


def _one_line_error(result: Any, *needles: str) -> str:
    """The command failed with one radixjobs error line naming the problem, and no traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) <= 3, result.stderr  # click's usage errors add a usage and a hint line
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return str(result.stderr)


# -- the daemon: an owner's unexpected error -----------------------------------------------------------
def test_owner_error_is_logged_counted_and_recovered(app: App, tmp_path: Path) -> None:
    daemon = Serve(tmp_path, "--poll", "0.2", env={"RADIXJOBS_DSN": app.dsn}, name="owner")
    try:
        wait_for(lambda: all(d["connected"] for d in daemon.status()["databases"]) and daemon.status()["databases"],
                 timeout=60, message="the owner to connect")
        assert daemon.status()["databases"][0]["owner_errors"] == 0
        for stmt in BREAK_NEXT_DUE_IN.strip().split(";\n"):
            app.conn.execute(stmt.encode())
        failed = wait_for(lambda: [line for line in daemon.log_lines()
                                   if line["message"].startswith("database owner failed")],
                          timeout=60, message="the owner's failure to be logged")
        assert failed[0]["level"] == "error", failed[0]
        assert failed[0]["error"] == "RaiseException", failed[0]
        assert "provoked by the test" in failed[0]["message"]
        database = wait_for(lambda: (d := daemon.status()["databases"][0])["owner_errors"] >= 1 and d,
                            timeout=60, message="the counter")
        assert set(database) == {"name", "connected", "running_attempts", "reconnects", "owner_errors", "cluster"}
        assert "provoked" not in json.dumps(daemon.status())  # counts only, no error text
        # it keeps retrying (with backoff) while the cause is there
        wait_for(lambda: daemon.status()["databases"][0]["owner_errors"] >= 2, timeout=60,
                 message="a retry")
        for stmt in MEND_NEXT_DUE_IN.strip().split(";\n"):
            app.conn.execute(stmt.encode())
        app.job("CREATE JOB app.after SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('after')")
        wait_for(lambda: any(row[1] == "after" for row in app.effects()), timeout=60,
                 message="a job to run after the cause was removed")
        assert daemon.status()["databases"][0]["connected"] is True
    finally:
        daemon.stop()


def test_one_daemon_is_one_live_node(app: App, tmp_path: Path, cli: Run) -> None:
    daemon = Serve(tmp_path, env={"RADIXJOBS_DSN": app.dsn}, name="solo")
    try:
        # one node row: the engine runs the documents too (no registration of their own)
        wait_for(lambda: app.conn.execute("SELECT count(*) FROM radix.nodes").fetchone() == (1,), timeout=60,
                 message="the daemon's engine to register")
        result = cli("status", "--json", "--http", "127.0.0.1:1")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["live_nodes"] == 1
    finally:
        daemon.stop()


# -- flags win over the environment ---------------------------------------------------------------------
def test_explicit_dsn_wins_over_the_environment(db: str, tmp_path: Path) -> None:
    wrong = "host=/nonexistent-socket-dir dbname=nowhere connect_timeout=2"
    for args in (["--dsn", db, "sql", "-c", "SELECT 7 AS seven"], ["sql", "--dsn", db, "-c", "SELECT 7 AS seven"]):
        result = run_cli("--json", *args, env={"RADIXJOBS_DSN": wrong})
        assert result.returncode == 0, (args, result.stderr)
        assert json.loads(result.stdout) == [{"seven": 7}]
    # the command's own flag wins over the global one; the environment alone is still used
    result = run_cli("--dsn", wrong, "sql", "--dsn", db, "-c", "SELECT 1 AS one")
    assert result.returncode == 0, result.stderr
    assert run_cli("sql", "-c", "SELECT 1", env={"RADIXJOBS_DSN": db}).returncode == 0


def test_explicit_home_wins_over_the_environment(tmp_path: Path) -> None:
    env = {"RADIXJOBS_HOME": str(tmp_path / "from-env")}
    for args in (["--json", "--home", str(tmp_path / "flag"), "db", "status"],
                 ["--json", "db", "status", "--home", str(tmp_path / "flag")]):
        result = run_cli(*args, env=env)
        assert result.returncode == 3, result.stderr
        assert json.loads(result.stdout)["home"] == str(tmp_path / "flag")


# -- bad input: one line, no traceback ---------------------------------------------------------------
def test_sql_file_not_utf8(cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "latin1.sql"
    path.write_bytes(b"SELECT 'caf\xe9';\n")
    _one_line_error(cli("sql", "-f", str(path)), "not valid UTF-8", "0xe9", "line 1, column 12")


def test_sql_repeated_c_runs_each_in_order(cli: Run) -> None:
    result = cli("sql", "-c", "SELECT 'first' AS a", "-c", "SELECT 'second' AS b; SELECT 'third' AS c")
    assert result.returncode == 0, result.stderr
    assert 0 < result.stdout.index("first") < result.stdout.index("second") < result.stdout.index("third")
    failed = cli("sql", "-c", "SELECT 1/0", "-c", "SELECT 'never' AS d")  # stops at the first failure
    assert failed.returncode != 0
    assert "never" not in failed.stdout


def test_docs_apply_of_a_json_scalar(cli: Run, tmp_path: Path, conn: psycopg.Connection[Any]) -> None:
    for text, kind in (("42", "a number"), ("null", "null"), ('"str"', "a string"), ("true", "a boolean")):
        path = tmp_path / "doc.json"
        path.write_text(text)
        _one_line_error(cli("docs", "apply", str(path)), kind, "expected one document")
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"dockind": "caf\xe9"}')
    _one_line_error(cli("docs", "apply", str(path)), "not valid UTF-8", "line 1, column 17")
    assert conn.execute("SELECT count(*) FROM radix.cron_table").fetchone() == (0,)


def test_bad_service_specs(cli: Run) -> None:
    for spec in ("x=not a spec", "x", "=mod:fn", "x=mod"):
        _one_line_error(cli("docs", "run", "--once", "--service", spec), "--service", "module:function")
        _one_line_error(cli("serve", "--http", "off", "--service", spec), "--service", "module:function")


def test_status_http_is_checked(cli: Run) -> None:
    for value in ("nonsense", "host:notaport", "ftp://127.0.0.1:1", "127.0.0.1:99999", "http://127.0.0.1:1/x"):
        _one_line_error(cli("status", "--http", value), "--http", "HOST:PORT")
    for value in ("127.0.0.1:1", "http://127.0.0.1:1", "http://127.0.0.1:1/"):
        result = cli("status", "--json", "--http", value)  # nothing answers there: the database does
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["source"] == "database"
