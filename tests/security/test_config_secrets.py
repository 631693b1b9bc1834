"""Secrets in ``serve --config`` files, and ``radixjobs check`` run by a role that is not the scheduler.

- A config file holding a secret (a DSN's password in any spelling, in any entry of ``dsn``, the console token)
  that every user may read stops ``serve`` at start and fails a reload (the daemon goes on as it was), in one
  line naming the file and the fix; one its group may read is warned about at start and on every reload; a
  private one (0600, or root's 0640) is silent. No line ever holds the secret.
- An invalid DSN that carries a password is one line without the text libpq quotes from it.
- ``radixjobs check`` connected as an ordinary role (a tenant, a ``radix_admin`` member) is one line naming it
  and the scheduler role, exit 1, no traceback.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.acceptance.conftest import run_cli
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.support import wait_for

SECRET = "hunter2-Sup3rSecret"
TOKEN = "t0ken-" + SECRET


def _uri(dsn: str, password: str) -> str:
    """``dsn`` as a postgresql:// URI with ``user:password@`` (the socket directory as the host parameter)."""
    params = conninfo_to_dict(dsn)
    return (f"postgresql://{params.get('user', 'postgres')}:{password}@/{params['dbname']}"
            f"?host={params['host']}&port={params.get('port', 5432)}")


# every place a secret can be in the file: (what, TOML text from the test's DSN)
SECRETS: list[tuple[str, Callable[[str], str]]] = [
    ("password keyword", lambda dsn: f"dsn = {json.dumps(f'{dsn} password={SECRET}')}\n"),
    ("sslpassword keyword", lambda dsn: f"dsn = {json.dumps(f'{dsn} sslpassword={SECRET}')}\n"),
    ("URI user:password@", lambda dsn: f"dsn = {json.dumps(_uri(dsn, SECRET))}\n"),
    ("URI ?password=", lambda dsn: f"dsn = {json.dumps(_uri(dsn, '').replace(':@', '@') + '&password=' + SECRET)}\n"),
    ("second cluster", lambda dsn: f"dsn = {json.dumps([dsn, f'{dsn} password={SECRET}'])}\n"),
    ("DSN libpq cannot read", lambda dsn: f"dsn = {json.dumps(f'{dsn} password={SECRET} oops')}\n"),
    ("console token", lambda dsn: f"dsn = {json.dumps(dsn)}\nhttp-token = {json.dumps(TOKEN)}\n"),
]


def _config(tmp_path: Path, text: str, mode: int) -> Path:
    path = tmp_path / "radixjobs.toml"
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


def _events(daemon: Serve, name: str) -> list[dict[str, Any]]:
    return [line for line in daemon.log_lines() if line.get("event") == name]


def _reload(daemon: Serve, event: str) -> dict[str, Any]:
    """SIGHUP; the log line of that reload (``reloaded`` or ``reload_failed``)."""
    before = len(_events(daemon, "reloaded")) + len(_events(daemon, "reload_failed"))
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: len(_events(daemon, "reloaded")) + len(_events(daemon, "reload_failed")) > before,
             timeout=60, message="the reload's line")
    line = (_events(daemon, "reloaded") + _events(daemon, "reload_failed"))[-1]
    assert line["event"] == event, line
    return line


@pytest.mark.parametrize(("what", "toml"), SECRETS, ids=[s[0] for s in SECRETS])
def test_a_config_file_every_user_may_read_with_a_secret_stops_serve(
        app: App, tmp_path: Path, what: str, toml: Callable[[str], str]) -> None:
    path = _config(tmp_path, toml(app.dsn), 0o644)
    done = run_cli("serve", "--config", str(path), "--http", "127.0.0.1:0")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    key = "http-token" if what == "console token" else "dsn"
    assert done.stderr.startswith(f"Error: config file {path}: holds a ")
    assert f"(key '{key}') and every user may read it (mode 0644): chmod 600 {path}" in done.stderr
    assert ("RADIXJOBS_HTTP_TOKEN" if key == "http-token" else "password file") in done.stderr
    assert SECRET not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_a_config_file_every_user_may_read_without_a_secret_is_used(app: App, tmp_path: Path) -> None:
    path = _config(tmp_path, f"dsn = {json.dumps(app.dsn)}\n", 0o644)
    daemon = Serve(tmp_path, "--config", str(path))
    try:
        assert not _events(daemon, "config_file_exposed")  # logged before the daemon serves, if at all
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
        assert not _events(daemon, "config_file_exposed")
    finally:
        daemon.stop()


def test_a_group_readable_config_with_a_password_is_warned_about_at_start_and_on_every_reload(
        app: App, tmp_path: Path) -> None:
    """As libpq judges a key file: the group may read → a warning each time; 0600 or root's 0640 → nothing;
    every user may read → the reload fails and the daemon goes on as it was."""
    path = _config(tmp_path, f"dsn = {json.dumps(app.dsn + ' password=' + SECRET)}\n", 0o640)
    if os.geteuid() == 0:  # root's 0640 file is the packaged layout (silent): make it another user's
        os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    daemon = Serve(tmp_path, "--config", str(path))
    try:
        warned = _events(daemon, "config_file_exposed")
        assert len(warned) == 1
        message = warned[0]["message"]
        assert message.startswith(f"config file {path} holds a password (key 'dsn') and the group ")
        assert f"may read it (mode 0640): chmod 600 {path}" in message
        assert warned[0]["level"] == "warning"
        _reload(daemon, "reloaded")
        assert len(_events(daemon, "config_file_exposed")) == 2

        path.chmod(0o600)
        _reload(daemon, "reloaded")
        assert len(_events(daemon, "config_file_exposed")) == 2
        if os.geteuid() == 0:
            os.chown(path, 0, -1)
            path.chmod(0o640)
            _reload(daemon, "reloaded")
            assert len(_events(daemon, "config_file_exposed")) == 2

        path.chmod(0o644)
        failed = _reload(daemon, "reload_failed")
        assert f"config file {path}: holds a password (key 'dsn') and every user may read it" in failed["message"]
        assert daemon.status()["databases"]  # still serving, as it was
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
    finally:
        daemon.stop()
    assert SECRET not in daemon.log.read_text()


def test_an_invalid_dsn_with_a_password_is_one_line_without_it(tmp_path: Path) -> None:
    path = _config(tmp_path, f"dsn = {json.dumps('host=/nowhere password=' + SECRET + ' oops')}\n", 0o600)
    for args in (["serve", "--config", str(path)], ["--dsn", f"host=/nowhere password={SECRET} oops", "check"]):
        done = run_cli(*args)
        assert done.returncode == 1, done.stderr
        assert done.stderr == 'radixjobs: error: invalid DSN: missing "=" after "…" in connection info string\n'
        assert "oops" not in done.stderr


def _schema_owner(app: App) -> str:
    row = app.conn.execute("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'radix'").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("kind", ["tenant", "radix_admin member"])
def test_check_as_a_role_that_is_not_the_scheduler_is_one_line_naming_both(
        app: App, roles: Any, kind: str) -> None:
    app.job("CREATE JOB app.tick SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('x')")
    role = roles("plain")
    if kind == "radix_admin member":
        app.conn.execute(sql.SQL("GRANT radix_admin TO {}").format(sql.Identifier(role)))
    for json_flag in ([], ["--json"]):
        done = run_cli("check", "--dsn", make_conninfo(app.dsn, user=role), *json_flag)
        assert done.returncode == 1, done.stderr
        assert done.stdout == ""
        assert done.stderr == (
            f"radixjobs: error: check reads the scheduler's own tables: connect as the scheduler role "
            f"{_schema_owner(app)} (the owner of the radix schema, as the daemon does) or a superuser, not {role}, "
            "which may not read radix.jobs; run it with the daemon's DSN, on the daemon's node as its OS user "
            "(docs/external.md)\n")
    done = run_cli("check", "--dsn", app.dsn)  # the scheduler itself
    assert done.returncode == 0, done.stderr
    assert "all 1 principal(s) can log in" in done.stdout
