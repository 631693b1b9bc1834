"""Who is looking at the console: the token or PostgreSQL login, sessions, CSRF, the passwordless check.

Invariants:
- A request is authenticated by exactly one of: ``Authorization: Bearer TOKEN`` (token mode; scripts, never
  sent by a browser on its own, so no CSRF token is needed), or the session cookie (HttpOnly,
  SameSite=Strict, a random id; the session itself stays in this process's memory).
- Every state-changing request from a session carries the session's CSRF token (compared in constant
  time) and, when the browser says where it comes from (Origin, Sec-Fetch-Site), comes from this origin.
- In postgres mode a session keeps the role and its password in memory only, to connect as that role;
  the connection demands that the server asked for a password (libpq ``require_auth``), reads no password
  file, and offers no client certificate, so nothing but the password typed in logs the role in.
- Sessions are bounded in number and idle time: at most ``MAX_SESSIONS_PER_ROLE`` per role (token mode:
  per token), a role's login past that ends that role's oldest session, never another role's.
- Every credential check (a login, a bearer token) passes the login throttle (throttle.py) first, keyed by
  the client and by what it logs in as; a failure is logged with the client and the role, never the secret.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.requests import Request

from radixjobs.db import first_line, scheduler_dsn
from radixjobs.errors import ConfigError
from radixjobs.server.console.throttle import LoginThrottle, client_key, retry_after

log = logging.getLogger("radixjobs.server.console")

COOKIE = "radixjobs_console"
MAX_SESSIONS_PER_ROLE = 64
MAX_ROLE_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: the server cuts a longer login name to this
IDLE_S = 8 * 3600
STATEMENT_TIMEOUT_MS = 5000
CONNECT_TIMEOUT_S = 5
PASSWORD_METHODS = "password,md5,scram-sha-256"  # noqa: S105 (libpq require_auth methods)

AuthMode = Literal["token", "postgres"]


@dataclass
class Session:
    sid: str
    csrf: str
    role: str | None = None  # postgres mode: the logged-in role
    password: str | None = field(default=None, repr=False)
    last_seen: float = field(default_factory=time.monotonic)
    flash: str | None = None


class LoginThrottled(Exception):
    """A credential check refused by the login throttle: ``wait_s`` seconds to wait."""

    def __init__(self, wait_s: float):
        super().__init__(f"too many failed logins: try again in {retry_after(wait_s)} s")
        self.wait_s = wait_s


class ConsoleAuth:
    """The console's access model, its sessions and its login throttle."""

    def __init__(self, mode: AuthMode = "token", token: str | None = None):
        self.mode: AuthMode = mode
        self.generated = token is None  # printed once at start (the operator was not told it otherwise)
        self.token = token or secrets.token_urlsafe(32)
        self.sessions: dict[str, Session] = {}
        self.throttle = LoginThrottle()

    # -- the throttle ------------------------------------------------------------------------------
    @staticmethod
    def login_keys(request: Request, role: str | None) -> list[str]:
        """The throttle keys of an attempt: its client, and the role (None: the token)."""
        return [client_key(request.client.host if request.client else None),
                "token" if role is None else f"role:{role}"]

    def begin_login(self, keys: list[str]) -> None:
        """Raise LoginThrottled when the attempt must wait; else it is in flight until ``end_login``."""
        wait = self.throttle.begin(keys)
        if wait > 0:
            if self.throttle.first_refusal(keys):  # once per backoff: a refused flood costs no log lines
                client, principal = keys
                log.warning("console login throttled %s as=%r retry_after_s=%.0f", client, principal, wait,
                            extra={"fields": {"event": "console_login_throttled", "client": client[7:],
                                              "as": principal, "retry_after_s": wait}})
            raise LoginThrottled(wait)

    def end_login(self, keys: list[str], *, failed: bool) -> None:
        wait = self.throttle.end(keys, failed=failed)
        if failed:
            client, principal = keys
            failures = self.throttle.failures(principal)
            log.warning("console login failed %s as=%r failures=%d client_failures=%d backoff_s=%.0f", client,
                        principal, failures, self.throttle.failures(client), wait,
                        extra={"fields": {"event": "console_login_failed", "client": client[7:],
                                          "as": principal, "failures": failures, "backoff_s": wait}})

    # -- tokens and sessions ------------------------------------------------------------------------
    def token_ok(self, given: str) -> bool:
        return self.mode == "token" and hmac.compare_digest(given.encode(), self.token.encode())

    def new_session(self, role: str | None = None, password: str | None = None) -> Session:
        """A session for ``role``; past MAX_SESSIONS_PER_ROLE that role's oldest ends (only that role's)."""
        self._expire()
        own = sorted((s for s in self.sessions.values() if s.role == role), key=lambda s: s.last_seen)
        for oldest in own[:max(0, len(own) - MAX_SESSIONS_PER_ROLE + 1)]:
            del self.sessions[oldest.sid]
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), role, password)
        self.sessions[session.sid] = session
        return session

    def end(self, session: Session) -> None:
        self.sessions.pop(session.sid, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for sid in [s.sid for s in self.sessions.values() if now - s.last_seen > IDLE_S]:
            del self.sessions[sid]

    def session_of(self, request: Request) -> Session | None:
        """The request's session (cookie), or a transient one for a valid bearer token; None: anonymous.
        Raises LoginThrottled for a bearer token the throttle does not let be checked now."""
        header = request.headers.get("authorization", "")
        if header[:7].lower() == "bearer ":
            if self.mode != "token":
                return None
            keys = self.login_keys(request, None)
            self.begin_login(keys)
            ok = self.token_ok(header[7:].strip())
            self.end_login(keys, failed=not ok)
            return Session("bearer", "") if ok else None
        sid = request.cookies.get(COOKIE, "")
        session = self.sessions.get(sid)
        if session is None:
            return None
        if time.monotonic() - session.last_seen > IDLE_S:
            self.end(session)
            return None
        session.last_seen = time.monotonic()
        return session

    def peek(self, request: Request) -> Session | None:
        """The request's cookie session, looked up only: its idle time is not renewed (None: anonymous)."""
        session = self.sessions.get(request.cookies.get(COOKIE, ""))
        if session is None or time.monotonic() - session.last_seen > IDLE_S:
            return None
        return session

    # -- CSRF ---------------------------------------------------------------------------------------
    @staticmethod
    def same_origin(request: Request) -> bool:
        """False when the browser says the request comes from another site."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = request.headers.get("origin")
        if origin is None:  # not a browser, or one that does not say: the CSRF token still decides
            return True
        host = request.headers.get("host", "")
        return origin in (f"http://{host}", f"https://{host}")

    def csrf_ok(self, request: Request, session: Session, given: str) -> bool:
        if session.sid == "bearer":
            return True
        return self.same_origin(request) and hmac.compare_digest(given.encode(), session.csrf.encode())


# -- connections -------------------------------------------------------------------------------------
def bounded_dsn(dsn: str) -> str:
    """``dsn`` with a statement and lock timeout and the pinned search_path (client options outrank a
    role's and a database's defaults)."""
    params = conninfo_to_dict(dsn)
    options = str(params.get("options") or "")
    bounds = f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={STATEMENT_TIMEOUT_MS}"
    params["options"] = f"{options} {bounds}".strip()
    params["connect_timeout"] = str(CONNECT_TIMEOUT_S)
    return scheduler_dsn(make_conninfo(**params))  # type: ignore[arg-type]


def role_dsn(dsn: str, role: str, password: str) -> str:
    """The daemon's DSN logged in as ``role`` with ``password`` only: no password file, no client
    certificate, no Kerberos, and the server must ask for the password."""
    params = {k: v for k, v in conninfo_to_dict(dsn).items()
              if k not in ("password", "passfile", "sslcert", "sslkey", "sslpassword", "service")}
    params.update(user=role, password=password, passfile="/nonexistent/radixjobs-no-passfile",
                  require_auth=PASSWORD_METHODS, gssencmode="disable", sslcertmode="disable")
    return bounded_dsn(make_conninfo(**params))  # type: ignore[arg-type]


def check_password_login(dsn: str, role: str, password: str) -> str | None:
    """Log in as ``role`` with ``password`` once; None on success, else a one-line reason."""
    try:
        with psycopg.connect(role_dsn(dsn, role, password), autocommit=True):
            return None
    except psycopg.Error as exc:
        text = first_line(exc)
        if "authentication" in text or "password" in text:
            return "login failed: wrong role or password"
        return f"login failed: {text}"


def refuse_passwordless(dsn: str) -> None:
    """Raise ConfigError when the server lets the daemon's own role in with a wrong password (trust,
    peer or ident authentication): postgres mode needs a server that checks passwords."""
    params = conninfo_to_dict(dsn)
    user = str(params.get("user") or "")
    probe = {k: v for k, v in params.items() if k not in ("password", "passfile", "sslcert", "sslkey")}
    probe.update(password=secrets.token_urlsafe(16), passfile="/nonexistent/radixjobs-no-passfile",
                 connect_timeout=str(CONNECT_TIMEOUT_S))
    try:
        with psycopg.connect(make_conninfo(**probe), autocommit=True):  # type: ignore[arg-type]
            pass
    except psycopg.Error:
        return
    raise ConfigError(f"--http-auth postgres needs a server that checks passwords, but this one let role "
                      f"{user or '(default)'} in with a wrong password (trust, peer or ident "
                      f"authentication): configure password authentication or use --http-auth token")
