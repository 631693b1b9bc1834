"""The console's login and logout: the token, or a PostgreSQL role and its password.

Invariants:
- Every credential check (the form, ``/login?token=``) passes the login throttle first (auth.begin_login):
  refused, it answers 429 with ``Retry-After`` and checks nothing; let through, its outcome is counted
  (auth.end_login) however the check ends.
- A role name PostgreSQL could not hold (empty, longer than 63 bytes, with a NUL) is refused before any
  check: the server would cut a longer name, so two spellings would reach one role under two throttle keys.
- A cross-site login is refused; a success gets a new session (auth.new_session) in an HttpOnly,
  SameSite=Strict cookie.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from radixjobs.server.console.auth import (
    COOKIE,
    MAX_ROLE_BYTES,
    ConsoleAuth,
    LoginThrottled,
    Session,
    check_password_login,
)
from radixjobs.server.console.forms import read_form
from radixjobs.server.console.throttle import retry_after

if TYPE_CHECKING:
    from radixjobs.server.daemon import Daemon


class Console(Protocol):
    """What the login needs of the console (app.Console, which imports this module)."""

    daemon: Daemon
    auth: ConsoleAuth
    gate: asyncio.Semaphore

    def databases(self) -> list[str]: ...

    def render(self, request: Request, session: Session | None, name: str, status_code: int = 200,
               **context: Any) -> Response: ...


def role_name_ok(role: str) -> bool:
    return 0 < len(role.encode("utf-8", "surrogatepass")) <= MAX_ROLE_BYTES and "\x00" not in role


class Login:
    def __init__(self, console: Console):
        self.console = console
        self.auth = console.auth

    def refused(self, request: Request, error: str, status_code: int = 401) -> Response:
        return self.console.render(request, None, "login.html", status_code=status_code, error=error)

    def throttled(self, request: Request, exc: LoginThrottled) -> Response:
        response = self.refused(request, f"{exc}", status_code=429)
        response.headers["Retry-After"] = retry_after(exc.wait_s)
        return response

    async def form(self, request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None and self.auth.mode == "token":
            return self.with_token(request, token)
        return self.console.render(request, None, "login.html", error=None)

    def with_token(self, request: Request, token: str) -> Response:
        keys = self.auth.login_keys(request, None)
        try:
            self.auth.begin_login(keys)
        except LoginThrottled as exc:
            return self.throttled(request, exc)
        ok = self.auth.token_ok(token)
        self.auth.end_login(keys, failed=not ok)
        if ok:
            return logged_in(self.auth.new_session())
        return self.refused(request, "that token is not valid")

    async def submit(self, request: Request) -> Response:
        if not self.auth.same_origin(request):
            return PlainTextResponse("cross-site login refused", status_code=403)
        form = await read_form(request)
        if self.auth.mode == "token":
            return self.with_token(request, str(form.get("token", "")))
        role, password = str(form.get("role", "")), str(form.get("password", ""))
        databases = self.console.databases()
        if not role or not password:
            return self.refused(request, "role and password are required")
        if not role_name_ok(role):
            return self.refused(request, "login failed: wrong role or password")
        if not databases:
            return self.refused(request, "the scheduler is not connected to any database yet: try again in a "
                                         "moment", status_code=503)
        owner = self.console.daemon.owners[databases[0]][0]
        keys = self.auth.login_keys(request, role)
        try:
            self.auth.begin_login(keys)
        except LoginThrottled as exc:
            return self.throttled(request, exc)
        problem: str | None = "login check interrupted"
        try:
            async with self.console.gate:
                problem = await asyncio.to_thread(check_password_login, owner.dsn, role, password)
        finally:
            self.auth.end_login(keys, failed=problem is not None)
        if problem:
            return self.refused(request, problem)
        return logged_in(self.auth.new_session(role, password))

    async def logout(self, request: Request, session: Session) -> Response:
        form = await read_form(request)
        if not self.auth.csrf_ok(request, session, str(form.get("csrf", ""))):
            return PlainTextResponse("CSRF check failed", status_code=403)
        self.auth.end(session)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response


def logged_in(session: Session) -> Response:
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, session.sid, httponly=True, samesite="strict", path="/")
    return response
