"""The web console against anyone who can reach the daemon's port.

- Without a session or the bearer token, every page and every action is refused and shows no data;
  /healthz, /metrics and /status stay anonymous (counts only).
- With a session, an action without the session's CSRF token, with another, or from another site is
  refused and changes nothing; a cross-site login is refused.
- Every page carries a CSP without inline script and forbids framing; the session cookie is HttpOnly and
  SameSite=Strict; no page has an inline script or event handler.
- ``--http-auth postgres`` refuses to start against a server that lets a role in without a password.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from radixjobs import catalog, migrate
from radixjobs.embedded import SUPERUSER, EmbeddedServer
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.console.support import TOKEN, request, serve_console
from tests.support import wait_for

PAGES = ["/", "/jobs", "/live", "/jobs?db=x&q=app", "/confirm?action=disable&db=x&target=app.tick",
         "/db/{db}/job/{job_id}", "/db/{db}/document/1", "/db/{db}/job/not-a-uuid"]


@pytest.fixture
def daemon(app: App, tmp_path: Path) -> Iterator[Serve]:
    app.job("CREATE JOB app.tick SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('secret-tag')")
    serve = serve_console(app, tmp_path)
    try:
        yield serve
    finally:
        serve.stop()


def _pages(app: App) -> list[str]:
    row = app.conn.execute("SELECT current_database(), job_id FROM radix.job_overview").fetchone()
    assert row is not None
    return [p.format(db=row[0], job_id=row[1]) for p in PAGES]


def _session(url: str) -> tuple[str, str]:
    """Log in with the token; the session cookie and the page's CSRF token."""
    status, headers, _ = request(url + "/login", "POST", {"Content-Type": "application/x-www-form-urlencoded"},
                                 urlencode({"token": TOKEN}).encode())
    assert status == 303
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie.replace("Strict", "strict")
    pair = cookie.split(";")[0]
    _, _, body = request(url + "/jobs", headers={"Cookie": pair})
    match = re.search(r'name="csrf" value="([^"]+)"', body)
    assert match
    return pair, match[1]


def _enabled(app: App) -> bool:
    row = app.conn.execute("SELECT enabled FROM radix.job_overview WHERE name = 'app.tick'").fetchone()
    assert row is not None
    return bool(row[0])


def test_no_page_or_action_without_authentication(app: App, daemon: Serve) -> None:
    db = app.conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
    for path in _pages(app):
        for headers in ({}, {"Accept": "text/html"}, {"Authorization": "Bearer wrong-token"},
                        {"Cookie": "radixjobs_console=forged"}, {"Authorization": f"Basic {TOKEN}"}):
            status, head, body = request(daemon.url + path, headers=headers)
            assert status in (401, 303, 429), (path, headers, status)  # 429: wrong tokens throttled
            assert status != 303 or head["location"] == "/login"
            assert "app.tick" not in body
            assert "secret-tag" not in body
    form = urlencode({"action": "disable", "db": db, "target": "app.tick", "csrf": "x"}).encode()
    for path in ("/action", "/logout"):
        status, _, _ = request(daemon.url + path, "POST", {"Content-Type": "application/x-www-form-urlencoded"},
                               form)
        assert status == 401
    assert _enabled(app)
    for path in ("/healthz", "/metrics", "/status"):
        assert request(daemon.url + path)[0] == 200
    status, _, body = request(daemon.url + "/no/such/page", headers={"Accept": "text/html"})
    assert status == 404
    assert 'href="/login"' in body  # the layout and a way to log in, nothing else
    assert 'href="/jobs"' not in body
    assert "app.tick" not in body
    # the wrong tokens above made the token wait out a backoff; then the right one is let in
    status, _, body = wait_for(lambda: (got := request(daemon.url + "/jobs", headers={
        "Authorization": f"Bearer {TOKEN}"}))[0] != 429 and got, timeout=120, interval=0.5,
        message="the token's backoff to end")
    assert status == 200
    assert "app.tick" in body


def test_actions_need_the_csrf_token_and_the_same_origin(app: App, daemon: Serve) -> None:
    db = app.conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
    cookie, csrf = _session(daemon.url)
    origin = daemon.url

    def act(token: str, **headers: str) -> int:
        form = urlencode({"action": "disable", "db": db, "target": "app.tick", "csrf": token,
                          "back": "/jobs"}).encode()
        return request(daemon.url + "/action", "POST", {"Cookie": cookie, "Content-Type":
                       "application/x-www-form-urlencoded", **headers}, form)[0]

    assert act("") == 403
    assert act("not-the-token") == 403
    assert act(csrf, Origin="http://evil.example") == 403
    assert act(csrf, **{"Sec-Fetch-Site": "cross-site"}) == 403
    assert act(csrf, **{"Sec-Fetch-Site": "same-site"}) == 403
    assert _enabled(app)
    assert act(csrf, Origin=origin, **{"Sec-Fetch-Site": "same-origin"}) == 303
    assert not _enabled(app)
    for back in ("//evil.example/x", "/\\evil.example", "http://evil.example"):  # never a redirect elsewhere
        form = urlencode({"action": "enable", "db": db, "target": "app.tick", "csrf": csrf, "back": back}).encode()
        status, headers, _ = request(daemon.url + "/action", "POST", {
            "Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"}, form)
        assert status == 303
        assert headers["location"] == "/jobs"
    status, _, _ = request(daemon.url + "/login", "POST", {"Content-Type": "application/x-www-form-urlencoded",
                                                           "Origin": "http://evil.example"},
                           urlencode({"token": TOKEN}).encode())
    assert status == 403


def test_security_headers_and_no_inline_script(app: App, daemon: Serve) -> None:
    cookie, _ = _session(daemon.url)
    for path in [*_pages(app), "/login"]:
        status, headers, body = request(daemon.url + path, headers={"Cookie": cookie})
        lower = {k.lower(): v for k, v in headers.items()}
        csp = lower["content-security-policy"]
        assert "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert "frame-ancestors 'none'" in csp
        assert lower["x-frame-options"] == "DENY"
        assert lower["x-content-type-options"] == "nosniff"
        assert status in (200, 400, 404), (path, status)
        assert not re.search(r"<script(?![^>]*\bsrc=)", body), path
        assert not re.search(r"\son[a-z]+\s*=", body), path
        assert "http://" not in body.replace(daemon.url, "")
        assert "https://" not in body


def test_postgres_login_refuses_a_server_without_passwords(app: App, tmp_path: Path) -> None:
    """The test cluster's trust socket lets any role in: postgres mode must not start on it."""
    env = {"RADIXJOBS_DSN": app.dsn}
    base = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "RADIXJOBS_DSN"}
    proc = subprocess.run([sys.executable, "-m", "radixjobs", "serve", "--http", "127.0.0.1:0", "--http-auth",
                           "postgres"], env={**base, **env}, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "needs a server that checks passwords" in proc.stderr
    assert "Traceback" not in proc.stderr


def _login(url: str, role: str, password: str, expect: int = 303) -> str:
    """Log in and return the session cookie; the page's error is in the message when the status is not ``expect``."""
    status, headers, body = request(url + "/login", "POST", {"Content-Type": "application/x-www-form-urlencoded"},
                                    urlencode({"role": role, "password": password}).encode())
    error = re.search(r'id="login-error">([^<]*)<', body)
    assert status == expect, f"login as {role}: {status} {error[1] if error else body[:300]}"
    return headers.get("set-cookie", "").split(";")[0]


def test_postgres_login_shows_and_acts_as_that_role_only(password_cluster: tuple[EmbeddedServer, str],
                                                         tmp_path: Path) -> None:
    server, super_dsn = password_cluster
    with psycopg.connect(super_dsn, autocommit=True) as su:
        su.execute(sql.SQL("ALTER ROLE {} PASSWORD 'operator-pw'").format(sql.Identifier(SUPERUSER)))
        su.execute("CREATE ROLE alice LOGIN PASSWORD 'alice-pw'")
        su.execute("CREATE ROLE bob LOGIN PASSWORD 'bob-pw'")
        su.execute("CREATE DATABASE console")
    db_dsn = make_conninfo(super_dsn, dbname="console")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        migrate.install(conn)
        for role in ("alice", "bob"):
            conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(role),
                                                                             sql.Identifier(role)))
            conn.execute(sql.SQL("CREATE PROCEDURE {}.p() LANGUAGE sql AS 'SELECT 1'").format(sql.Identifier(role)))
            with psycopg.connect(make_conninfo(db_dsn, user=role), autocommit=True) as own:
                catalog.execute_job_ddl(own, f"CREATE JOB {role}.job_of_{role} SCHEDULE EVERY INTERVAL '1 hour' "
                                             f"RUN AS {role} CALL {role}.p()")
    (server.pgdata / "pg_hba.conf").write_text("local all all scram-sha-256\n")
    with psycopg.connect(super_dsn, autocommit=True) as su:
        su.execute("SELECT pg_reload_conf()")
    daemon = Serve(tmp_path, "--http-auth", "postgres",
                   env={"RADIXJOBS_DSN": make_conninfo(db_dsn, password="operator-pw")}, name="pgauth")
    try:
        wait_for(lambda: daemon.status()["databases"], message="the daemon to serve its database")
        _login(daemon.url, "alice", "wrong", expect=401)
        _login(daemon.url, "nobody", "x", expect=401)
        alice = _login(daemon.url, "alice", "alice-pw")
        _, _, body = request(daemon.url + "/jobs", headers={"Cookie": alice})
        assert "alice.job_of_alice" in body
        assert "bob.job_of_bob" not in body
        assert "role alice" in body
        _, _, overview = request(daemon.url + "/", headers={"Cookie": alice})
        assert 'id="nodes-hidden"' in overview  # a tenant sees neither nodes nor the daemon's counters
        assert "nodes alive" not in overview
        assert "Since this node started" not in overview
        operator = _login(daemon.url, SUPERUSER, "operator-pw")
        _, _, overview = request(daemon.url + "/", headers={"Cookie": operator})
        assert re.search(r'id="nodes-alive">1<', overview)
        assert "Since this node started" in overview
        csrf = re.search(r'name="csrf" value="([^"]+)"', body)
        assert csrf
        form = urlencode({"action": "disable", "db": "console", "target": "bob.job_of_bob", "csrf": csrf[1],
                          "back": "/jobs"}).encode()
        status, _, _ = request(daemon.url + "/action", "POST", {"Cookie": alice, "Content-Type":
                               "application/x-www-form-urlencoded"}, form)
        assert status == 303
        _, _, body = request(daemon.url + "/jobs", headers={"Cookie": alice})
        assert "refused:" in body
        bob = _login(daemon.url, "bob", "bob-pw")
        _, _, body = request(daemon.url + "/jobs", headers={"Cookie": bob})
        assert "bob.job_of_bob" in body
        assert "alice.job_of_alice" not in body
        with psycopg.connect(make_conninfo(db_dsn, password="operator-pw"),
                             autocommit=True) as conn:
            enabled = conn.execute("SELECT enabled FROM radix.jobs WHERE job_name = 'job_of_bob'").fetchone()
        assert enabled == (True,)
        assert request(daemon.url + "/jobs", headers={"Authorization": "Bearer anything"})[0] == 401
    finally:
        daemon.stop()


async def test_postgres_login_before_any_database_is_served_says_so() -> None:
    """Until the daemon serves a database, no password can be checked: 503 with the reason, not a 401 that
    blames the role or the password (seen in CI: a login right after start)."""
    import httpx

    from radixjobs.server import Daemon, DaemonConfig
    from radixjobs.server.console import ConsoleAuth
    from radixjobs.server.http import make_app

    daemon = Daemon(DaemonConfig(dsn="host=/nonexistent-socket-dir dbname=nowhere"))
    transport = httpx.ASGITransport(app=make_app(daemon, ConsoleAuth("postgres")))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        response = await client.post("/login", data={"role": "alice", "password": "alice-pw"})
    assert response.status_code == 503
    assert "not connected to any database yet" in response.text
    assert "set-cookie" not in response.headers
