"""Console logins against password guessing and session flooding, through a real daemon on loopback.

- A burst of wrong passwords for one role is checked only a few times: the rest get 429 with Retry-After,
  and the right password is refused too until the backoff has passed; another client address gets the same
  429 for that role, not for another role; one client trying many roles is held back on its own.
- The token (form, ``/login?token=``, bearer) is throttled the same way.
- Every failure and the start of each backoff are logged, with the client and the role, never the password.
- One role's logins past its session cap end only its own oldest sessions: another role stays logged in.
"""

from __future__ import annotations

import http.client
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from radixjobs import migrate
from radixjobs.embedded import SUPERUSER, EmbeddedServer
from radixjobs.server.console.auth import MAX_SESSIONS_PER_ROLE
from radixjobs.server.console.throttle import FREE_FAILURES, delay_after
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.console.support import TOKEN, serve_console
from tests.support import wait_for

PASSWORDS = {"alice": "alice-pw-7Gq", "bob": "bob-pw-3Kx", SUPERUSER: "operator-pw"}
BURST = 30
FLOOD_LOGINS = 300  # more than any cap the whole console has had


class Client:
    """HTTP requests to the daemon from one loopback source address (127.0.0.x: the daemon's client key)."""

    def __init__(self, url: str, source: str = "127.0.0.1"):
        parts = urlsplit(url)
        assert parts.hostname == "127.0.0.1"
        self.port = parts.port or 80
        self.source = source

    def request(self, method: str, path: str, body: str | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30, source_address=(self.source, 0))
        try:
            sent = {"Content-Type": "application/x-www-form-urlencoded"} if body is not None else {}
            conn.request(method, path, body=body, headers={**sent, **(headers or {})})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
        finally:
            conn.close()

    def login(self, role: str, password: str) -> tuple[int, dict[str, str]]:
        status, headers, _ = self.request("POST", "/login", urlencode({"role": role, "password": password}))
        return status, headers

    def cookie(self, role: str) -> str:
        status, headers = self.login(role, PASSWORDS[role])
        assert status == 303, (role, status)
        return headers["set-cookie"].split(";")[0]


@pytest.fixture
def pg_daemon(password_cluster: tuple[EmbeddedServer, str], tmp_path: Path) -> Iterator[Serve]:
    """``serve --http-auth postgres`` on a cluster with scram authentication, roles alice and bob."""
    server, super_dsn = password_cluster
    with psycopg.connect(super_dsn, autocommit=True) as su:
        for role, password in PASSWORDS.items():
            verb = "ALTER" if role == SUPERUSER else "CREATE"
            su.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role),
                                                                           sql.Literal(password)))
        su.execute("CREATE DATABASE console")
    with psycopg.connect(make_conninfo(super_dsn, dbname="console"), autocommit=True) as conn:
        migrate.install(conn)
    (server.pgdata / "pg_hba.conf").write_text("local all all scram-sha-256\n")
    with psycopg.connect(super_dsn, autocommit=True) as su:
        su.execute("SELECT pg_reload_conf()")
    dsn = make_conninfo(super_dsn, dbname="console", password=PASSWORDS[SUPERUSER])
    daemon = Serve(tmp_path, "--http-auth", "postgres", env={"RADIXJOBS_DSN": dsn}, name="logins")
    try:
        wait_for(lambda: daemon.status()["databases"], message="the daemon to serve its database")
        yield daemon
    finally:
        daemon.stop()


def _most_checked(elapsed_s: float) -> int:
    """The most failures the backoff lets be checked in ``elapsed_s``: the free ones, then one per delay."""
    checked, spent = FREE_FAILURES, 0.0
    while spent <= elapsed_s:
        spent += delay_after(checked)
        checked += 1
    return checked


class Burst:
    """Attempts sent as fast as they are answered. ``last_checked``: when the last one answered 401 was
    sent; the server counted that failure no earlier, so its backoff cannot end before that plus the delay."""

    def __init__(self, attempt: Callable[[int], tuple[int, dict[str, str]]], count: int = BURST):
        self.attempt = attempt
        started = time.monotonic()
        self.statuses: list[int] = []
        self.refused: dict[str, str] = {}
        self.last_checked = started
        for i in range(count):
            self.send(i)
        self.elapsed = time.monotonic() - started
        self.checked = self.statuses.count(401)

    def send(self, i: int) -> int:
        sent = time.monotonic()
        status, headers = self.attempt(i)
        self.statuses.append(status)
        if status == 401:
            self.last_checked = sent
        elif status == 429:
            self.refused = headers
        return status

    def one_more_failure(self) -> None:
        """Wait for the backoff to let one more attempt be checked (it fails: 401)."""
        assert _let_through(lambda: self.send(len(self.statuses))) == 401
        self.checked += 1

    def still_waiting(self) -> bool:
        """Whether the backoff of the last failure can still be running (the answer must be 429 then)."""
        return time.monotonic() - self.last_checked < delay_after(self.checked)


def _let_through(attempt: Callable[[], int]) -> int:
    """The first status of ``attempt`` that is not 429 (polled until the backoff ends)."""
    return wait_for(lambda: (status := attempt()) != 429 and status, timeout=120, interval=0.25,
                    message="the backoff to end")


def test_password_guessing_is_throttled_per_role_and_per_client(pg_daemon: Serve) -> None:
    attacker = Client(pg_daemon.url)
    burst = Burst(lambda _: attacker.login("alice", "guess"))
    assert set(burst.statuses) == {401, 429}, burst.statuses
    assert FREE_FAILURES <= burst.checked <= _most_checked(burst.elapsed), (burst.checked, burst.elapsed)
    assert burst.refused["retry-after"].isdigit()
    assert 1 <= int(burst.refused["retry-after"]) <= math.ceil(delay_after(burst.checked))
    # more failures, a longer backoff: each guess waits for the previous one's
    while burst.checked < FREE_FAILURES + 3:
        burst.one_more_failure()
    # per role: from another client address too, the right password for alice is refused; bob is let in
    other = Client(pg_daemon.url, "127.0.0.2")
    status, _ = other.login("alice", PASSWORDS["alice"])
    assert status == 429 or not burst.still_waiting(), status
    assert other.login("bob", PASSWORDS["bob"])[0] == 303
    status, _ = attacker.login("alice", PASSWORDS["alice"])
    assert status == 429 or not burst.still_waiting(), status
    assert _let_through(lambda: attacker.login("alice", PASSWORDS["alice"])[0]) == 303
    assert not burst.still_waiting()  # let in after the backoff, never before
    # per client: one address trying a new role each time is held back on its own
    sprayer = Client(pg_daemon.url, "127.0.0.3")
    spray = Burst(lambda i: sprayer.login(f"role_{i}", "guess"))
    assert set(spray.statuses) == {401, 429}, spray.statuses
    assert spray.checked <= _most_checked(spray.elapsed)
    status, _ = sprayer.login("bob", PASSWORDS["bob"])
    assert status == 429 or not spray.still_waiting(), status
    assert Client(pg_daemon.url, "127.0.0.4").login("bob", PASSWORDS["bob"])[0] == 303
    logs = pg_daemon.log.read_text()
    assert all(password not in logs for password in ("guess", *PASSWORDS.values()))
    events = [line for line in pg_daemon.log_lines() if str(line.get("event", "")).startswith("console_login")]
    failed = [e for e in events if e["event"] == "console_login_failed"]
    assert {(e["client"], e["as"]) for e in failed} >= {("127.0.0.1", "role:alice"), ("127.0.0.3", "role:role_0")}
    assert max(e["failures"] for e in failed if e["as"] == "role:alice") == burst.checked
    assert any(e["event"] == "console_login_throttled" and e["as"] == "role:alice" for e in events)
    throttled = [e for e in events if e["event"] == "console_login_throttled"]
    assert len(throttled) < len(failed) + 4  # once per backoff, not once per refused request


def test_one_roles_logins_never_end_another_roles_session(pg_daemon: Serve) -> None:
    client = Client(pg_daemon.url)
    alice = client.cookie("alice")
    bobs = [client.cookie("bob") for _ in range(FLOOD_LOGINS)]

    def status_of(cookie: str) -> int:
        return client.request("GET", "/jobs", headers={"Cookie": cookie})[0]

    assert status_of(alice) == 200
    assert "role alice" in client.request("GET", "/jobs", headers={"Cookie": alice})[2]
    ended = FLOOD_LOGINS - MAX_SESSIONS_PER_ROLE
    assert [status_of(c) for c in bobs] == [401] * ended + [200] * MAX_SESSIONS_PER_ROLE  # bob's own cap


def test_token_guessing_is_throttled(app: App, tmp_path: Path) -> None:
    daemon = serve_console(app, tmp_path)
    try:
        client = Client(daemon.url)
        burst = Burst(lambda i: client.request("POST", "/login", urlencode({"token": f"guess-{i}"}))[:2])
        assert set(burst.statuses) == {401, 429}, burst.statuses
        assert FREE_FAILURES <= burst.checked <= _most_checked(burst.elapsed)
        # the same throttle for the link form and the bearer token, from another address too
        other = Client(daemon.url, "127.0.0.2")
        status, headers, body = other.request("GET", f"/login?token={TOKEN}")
        assert status == 429 or not burst.still_waiting(), status
        status, headers, body = other.request("GET", "/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 429 or not burst.still_waiting(), status
        assert status != 429 or (headers["retry-after"].isdigit() and "app." not in body)
        assert _let_through(lambda: other.request("GET", "/jobs", headers={
            "Authorization": f"Bearer {TOKEN}"})[0]) == 200
        assert not burst.still_waiting()
        assert TOKEN not in daemon.log.read_text()
    finally:
        daemon.stop()
