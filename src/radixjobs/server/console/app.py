"""The console's routes: pages, actions, login; every one but the login form requires a session.

Invariants:
- Every page and action handler runs behind ``_guard``: no session (cookie or bearer token), no data;
  an action also needs the session's CSRF token and a same-origin request. The login itself is login.py.
- Database work runs in worker threads on short-lived connections, at most ``MAX_CONCURRENT`` at once for
  the whole console (the scheduler's own connections are never shared with it), each bounded by the
  statement timeout of auth.bounded_dsn.
- In token mode the console reads as the daemon's scheduler role; in postgres mode as the logged-in role,
  with its password: what PostgreSQL shows that role is what the page shows.
- Rendering is autoescaped (Jinja2); nothing from a request or a row is ever written unescaped.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import psycopg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from radixjobs.catalog import describe_arguments
from radixjobs.db import first_line
from radixjobs.server.console import charts, present, queries
from radixjobs.server.console.auth import ConsoleAuth, LoginThrottled, Session, bounded_dsn, role_dsn
from radixjobs.server.console.forms import read_form
from radixjobs.server.console.login import Login
from radixjobs.server.console.throttle import retry_after
from radixjobs.server.daemon import Daemon

HERE = Path(__file__).parent
MAX_CONCURRENT = 4
PAGE_SIZE = 50
STATES = ("scheduled", "running", "retry_wait", "complete", "failed", "disabled", "active", "passive", "error")
HISTORY_STATUSES = ("succeeded", "failed", "running", "lease_lost", "released", "missed")
ACTIONS = {"run": "Run {target} now", "enable": "Enable {target}", "disable": "Disable {target}",
           "activate": "Make document {target} ACTIVE", "passivate": "Make document {target} PASSIVE"}
T = TypeVar("T")
Handler = Callable[[Request, Session], Awaitable[Response]]


SAFE_BACK = re.compile(r"/(?![/\\])[\w/.%?=&-]*")


def safe_back(value: str) -> str:
    """Where to return after an action: a path of this site only (never "//host" or "/\\host")."""
    return value if SAFE_BACK.fullmatch(value) else "/jobs"


def _number(value: str | None, default: int, maximum: int) -> int:
    """A positive integer query parameter, clamped; anything else is the default."""
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 19:
        return default
    return max(1, min(maximum, int(value)))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Console:
    def __init__(self, daemon: Daemon, auth: ConsoleAuth):
        self.daemon = daemon
        self.auth = auth
        self.gate = asyncio.Semaphore(MAX_CONCURRENT)
        self.env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(
            default=True, default_for_string=True), trim_blocks=True, lstrip_blocks=True)
        self.env.globals.update(iso=present.iso, relative=present.relative, seconds=present.seconds,
                                outcome_class=present.outcome_class, schedule_words=present.schedule_words,
                                describe_arguments=describe_arguments)
        self.env.filters["pretty"] = present.pretty

    # -- plumbing -----------------------------------------------------------------------------------
    def databases(self) -> list[str]:
        return sorted(self.daemon.owners)

    def dsn(self, database: str, session: Session) -> str:
        owner = self.daemon.owners[database][0]
        if self.auth.mode == "postgres":
            return role_dsn(owner.dsn, session.role or "", session.password or "")
        return bounded_dsn(owner.dsn)

    async def run(self, database: str, session: Session, work: Callable[[queries.Conn], T]) -> T:
        """``work`` on a fresh bounded connection to ``database`` as the session's role, in a thread."""
        if database not in self.daemon.owners:
            raise LookupError(f"database {database!r} is not served by this daemon")
        dsn = self.dsn(database, session)

        def job() -> T:
            with queries.connect(dsn) as conn:
                return work(conn)

        async with self.gate:
            return await asyncio.to_thread(job)

    def render(self, request: Request, session: Session | None, name: str, status_code: int = 200,
               **context: Any) -> HTMLResponse:
        flash = None
        if session is not None and session.flash:
            flash, session.flash = session.flash, None
        html = self.env.get_template(name).render(
            request=request, session=session, mode=self.auth.mode, flash=flash, now=_now(),
            databases=self.databases(), role=session.role if session else None, **context)
        return HTMLResponse(html, status_code=status_code, headers={"Cache-Control": "no-store"})

    def _guard(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            try:
                session = self.auth.session_of(request)
            except LoginThrottled as exc:
                return PlainTextResponse(str(exc), status_code=429, headers={"Retry-After": retry_after(exc.wait_s)})
            if session is None:
                if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
                    return RedirectResponse("/login", status_code=303)  # a browser: to the login form
                return PlainTextResponse("authentication required", status_code=401,
                                         headers={"WWW-Authenticate": 'Bearer realm="radixjobs"'})
            return await handler(request, session)
        return guarded

    # -- pages ----------------------------------------------------------------------------------------
    async def overview(self, request: Request, session: Session) -> Response:
        now = _now()
        per_db, errors = [], []
        all_recent: list[dict[str, Any]] = []
        nodes: dict[str, dict[str, Any]] = {}
        for name in self.databases():
            owner = self.daemon.owners[name][0]
            try:
                data = await self.run(name, session, queries.overview)
            except (psycopg.Error, LookupError) as exc:
                errors.append(f"{name}: {first_line(exc)}")
                continue
            all_recent.extend(data["recent"])
            for node in data["nodes"] or []:
                entry = nodes.setdefault(node["node_id"], {**node, "claims": 0, "databases": []})
                entry["alive"] = entry["alive"] or node["alive"]
                entry["databases"].append(name)
            for node_id, claims in data["claims"].items():
                nodes.setdefault(node_id, {"node_id": node_id, "alive": None, "claims": 0, "databases": [name]})
                nodes[node_id]["claims"] += claims
            per_db.append({"name": name, "connected": owner.connected, "running": owner.running,
                           "nodes_visible": data["nodes"] is not None})
        minute = [r for r in all_recent if (now - r["started_at"]).total_seconds() <= 60]
        failures: dict[str, int] = {}
        for row in all_recent:
            if row["status"] in ("failed", "lease_lost", "missed"):
                key = row["category"] or row["status"]
                failures[key] = failures.get(key, 0) + 1
        # the daemon's own figures (nodes, slots, counters, attempts running) are the operator's to see
        operator = self.auth.mode == "token" or (bool(per_db) and all(d["nodes_visible"] for d in per_db))
        return self.render(request, session, "overview.html", page="overview", per_db=per_db, errors=errors,
                           nodes=sorted(nodes.values(), key=lambda n: n["node_id"]), slots=self.daemon.slots,
                           attempts_min=len(minute), attempts_hour=len(all_recent), failures=failures,
                           counters=self.daemon.counters(), chart=charts.lateness_chart(all_recent, now),
                           operator=operator)

    async def jobs(self, request: Request, session: Session) -> Response:
        params = request.query_params
        chosen = params.get("db") or None
        state = params.get("state") or None
        text = (params.get("q") or "").strip()[:200] or None
        page = _number(params.get("page"), 1, 100_000)
        offset = (page - 1) * PAGE_SIZE
        rows: list[dict[str, Any]] = []
        errors: list[str] = []
        total = 0
        for name in [d for d in self.databases() if chosen in (None, d)]:
            try:
                found, count = await self.run(name, session, partial(
                    queries.page_items, state=state, text=text, offset=max(0, offset - total),
                    limit=PAGE_SIZE - len(rows)))
                rows.extend({**r, "db": name} for r in found)
            except (psycopg.Error, LookupError) as exc:
                errors.append(f"{name}: {first_line(exc)}")
                continue
            total += count
        pages = max(1, -(-total // PAGE_SIZE))

        def link(**changes: Any) -> str:
            query = {"db": chosen or "", "state": state or "", "q": text or "", "page": page, **changes}
            return "/jobs?" + urlencode({k: v for k, v in query.items() if v not in ("", None)})

        return self.render(request, session, "jobs.html", page="jobs", rows=rows, total=total, page_no=page,
                           pages=pages, chosen=chosen, state=state, text=text, states=STATES, errors=errors,
                           link=link)

    async def job(self, request: Request, session: Session) -> Response:
        database, job_id = request.path_params["db"], request.path_params["job_id"]
        params = request.query_params
        window = params.get("window") or "10m"
        window = window if window in present.WINDOWS else "10m"
        status = params.get("status") or None
        status = status if status in HISTORY_STATUSES else None
        before = _number(params.get("before"), 0, 2**62) or None
        window_s = present.WINDOWS[window]

        def read(conn: queries.Conn) -> dict[str, Any]:
            row = queries.job(conn, job_id)
            if row is None:
                return {"row": None}
            return {"row": row, "running_since": queries.running_since(conn, [job_id]).get(job_id),
                    "timeline": queries.history(conn, job_id, since_s=window_s, limit=queries.TIMELINE_MAX),
                    "history": queries.history(conn, job_id, status=status, before=before)}

        try:
            data = await self.run(database, session, read)
        except (psycopg.Error, LookupError, ValueError) as exc:
            return self.render(request, session, "missing.html", status_code=404, what=first_line(exc))
        if data["row"] is None:
            return self.render(request, session, "missing.html", status_code=404,
                               what="no such job, or not visible to you")
        history = data["history"]
        older = history[-1]["history_id"] if len(history) == queries.HISTORY_PAGE else None
        return self.render(request, session, "job.html", page="jobs", db=database, job=data["row"],
                           history=history, older=older, window=window, running_since=data["running_since"],
                           windows=present.WINDOWS, status=status, statuses=HISTORY_STATUSES,
                           chart=charts.timeline(data["timeline"], _now(), window_s),
                           graph=charts.dependency_graph(data["row"]))

    async def document(self, request: Request, session: Session) -> Response:
        database, num = request.path_params["db"], request.path_params["num"]

        def read(conn: queries.Conn) -> dict[str, Any]:
            return {"row": queries.document(conn, num), "processes": queries.processes(conn, num)}

        try:
            data = await self.run(database, session, read)
        except (psycopg.Error, LookupError) as exc:
            return self.render(request, session, "missing.html", status_code=404, what=first_line(exc))
        if data["row"] is None:
            return self.render(request, session, "missing.html", status_code=404,
                               what="no such document, or not visible to you")
        return self.render(request, session, "document.html", page="jobs", db=database, doc=data["row"],
                           processes=data["processes"])

    async def live(self, request: Request, session: Session) -> Response:
        attempts: list[dict[str, Any]] = []
        processes: list[dict[str, Any]] = []
        errors: list[str] = []
        for name in self.databases():
            try:
                data = await self.run(name, session, queries.live)
            except (psycopg.Error, LookupError) as exc:
                errors.append(f"{name}: {first_line(exc)}")
                continue
            attempts.extend({**r, "db": name} for r in data["attempts"])
            processes.extend({**r, "db": name} for r in data["processes"])
        return self.render(request, session, "live.html", page="live", attempts=attempts, processes=processes,
                           errors=errors)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        """Any path no route serves: the page layout with a way back for a browser, plain text otherwise."""
        if "text/html" not in request.headers.get("accept", ""):
            return PlainTextResponse("Not Found", status_code=404)
        return self.render(request, self.auth.peek(request), "missing.html", status_code=404,
                           what="no page at this address")

    # -- actions ----------------------------------------------------------------------------------------
    async def confirm(self, request: Request, session: Session) -> Response:
        params = request.query_params
        action, database, target = params.get("action", ""), params.get("db", ""), params.get("target", "")
        back = params.get("back", "/jobs")
        if action not in ACTIONS or database not in self.daemon.owners or not target:
            return PlainTextResponse("unknown action", status_code=400)
        return self.render(request, session, "confirm.html", page="jobs", action=action, db=database,
                           target=target, back=safe_back(back), question=ACTIONS[action].format(target=target))

    async def act(self, request: Request, session: Session) -> Response:
        form = await read_form(request)
        if not self.auth.csrf_ok(request, session, str(form.get("csrf", ""))):
            return PlainTextResponse("CSRF check failed", status_code=403)
        action, database, target = (str(form.get(k, "")) for k in ("action", "db", "target"))
        back = str(form.get("back", "/jobs"))
        if action not in ACTIONS or database not in self.daemon.owners or not target:
            return PlainTextResponse("unknown action", status_code=400)
        work: Callable[[queries.Conn], tuple[bool, str]] = {
            "run": lambda c: queries.run_job(c, target),
            "enable": lambda c: queries.set_enabled(c, target, True),
            "disable": lambda c: queries.set_enabled(c, target, False),
            "activate": lambda c: queries.set_document_status(c, target, True),
            "passivate": lambda c: queries.set_document_status(c, target, False),
        }[action]
        try:
            ok, message = await self.run(database, session, work)
        except psycopg.Error as exc:
            ok, message = False, first_line(exc)
        if self.auth.sessions.get(session.sid) is None:  # bearer: no page to come back to
            return PlainTextResponse(message, status_code=200 if ok else 409)
        session.flash = ("done: " if ok else "refused: ") + message
        return RedirectResponse(safe_back(back), status_code=303)

    # -- routes -----------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        g = self._guard
        login = Login(self)
        return [
            Route("/", g(self.overview)),
            Route("/jobs", g(self.jobs)),
            Route("/live", g(self.live)),
            Route("/db/{db:path}/job/{job_id}", g(self.job)),
            Route("/db/{db:path}/document/{num}", g(self.document)),
            Route("/confirm", g(self.confirm)),
            Route("/action", g(self.act), methods=["POST"]),
            Route("/login", login.form, methods=["GET"]),
            Route("/login", login.submit, methods=["POST"]),
            Route("/logout", g(login.logout), methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
        ]
