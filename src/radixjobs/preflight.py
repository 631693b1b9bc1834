"""Can every principal log in from this node? The check behind ``radixjobs check`` and ``serve``'s start.

Each principal of an enabled job or an active CRON_TABLE document is logged in exactly as the engine
would (``principal_dsn``: the password file only, ``PGPASSWORD`` hidden), with a short connect timeout,
and nothing is run on the connection. A failure is reported by kind (``retry.classify``) with a fixed
fix text built from what radixjobs knows itself (principal, database, this node's address as the server
sees it, the password file's path, the server's major version) — never the server's message for a
security failure, so a report holds no more than the operator's own configuration.

The principals are read on the scheduler's own pinned connection (lock waits bounded, connect bounded);
logins run a few at a time, each bounded by its connect timeout. A role that may not read the scheduler's
tables (neither the scheduler nor a superuser: a tenant, a ``radix_admin`` member) is refused before any
login, in one line naming it and the scheduler role: a check of only the principals a role may see would
call "all can log in" what is a part of the daemon's logins.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from radixjobs import retry
from radixjobs.db import abound_lock_waits, first_line, scheduler_dsn
from radixjobs.engine.principals import principal_dsn
from radixjobs.errors import RadixError

log = logging.getLogger("radixjobs.server")

CONNECT_TIMEOUT_S = 5
PARALLEL_LOGINS = 4

# Principals of enabled jobs and active documents, with what uses them, read from the tables the scheduler
# owns (the overview views show a role only what it may see; the scheduler must see everything).
PRINCIPALS = """
SELECT u.principal::pg_catalog.text, pg_catalog.array_agg(u.used_by ORDER BY u.used_by)
FROM (SELECT j.principal_name AS principal,
             pg_catalog.quote_ident(j.schema_name) OPERATOR(pg_catalog.||) '.'
             OPERATOR(pg_catalog.||) pg_catalog.quote_ident(j.job_name) AS used_by
      FROM radix.jobs j WHERE j.enabled
      UNION ALL
      SELECT pg_catalog.pg_get_userbyid(d.principal_oid), 'doc:' OPERATOR(pg_catalog.||) d.num
      FROM radix.cron_table d WHERE d.status OPERATOR(pg_catalog.=) 'CRON_TABLE_ACTIVE') u
GROUP BY u.principal ORDER BY 1
"""
# Where this node's logins come from, as the server sees them, and the scheduler's own grants; whether this
# role may read what PRINCIPALS reads, and which role owns the radix schema (the one the daemon connects as).
CONTEXT = """
SELECT pg_catalog.host(pg_catalog.inet_client_addr()), pg_catalog.current_database()::pg_catalog.text,
       pg_catalog.current_setting('server_version_num')::pg_catalog.int4 / 10000,
       SESSION_USER::pg_catalog.text,
       pg_catalog.pg_has_role(SESSION_USER, 'pg_signal_backend', 'USAGE'),
       pg_catalog.pg_has_role(SESSION_USER, 'pg_read_all_stats', 'USAGE'),
       CURRENT_USER::pg_catalog.text,
       (SELECT pg_catalog.pg_get_userbyid(n.nspowner)::pg_catalog.text FROM pg_catalog.pg_namespace n
        WHERE n.nspname OPERATOR(pg_catalog.=) 'radix'::pg_catalog.name),
       pg_catalog.has_table_privilege('radix.jobs'::pg_catalog.text, 'SELECT'::pg_catalog.text)
       AND pg_catalog.has_table_privilege('radix.cron_table'::pg_catalog.text, 'SELECT'::pg_catalog.text)
"""


class NotTheScheduler(RadixError):
    """The role checking may not read the scheduler's own tables (it is neither the scheduler nor a superuser)."""

    code = "42501"

    def __init__(self, role: str, scheduler: str | None):
        super().__init__(
            f"check reads the scheduler's own tables: connect as the scheduler role {scheduler or '?'} (the "
            f"owner of the radix schema, as the daemon does) or a superuser, not {role}, which may not read "
            "radix.jobs; run it with the daemon's DSN, on the daemon's node as its OS user (docs/external.md)")


@dataclass(frozen=True)
class Context:
    """What the fix texts are built from."""

    client_addr: str | None  # None: a unix socket (pg_hba ``local``)
    database: str
    server_major: int
    scheduler: str
    signal_backend: bool
    read_all_stats: bool
    host: str  # the password file's host field: "*" for a unix socket (libpq matches its path, or localhost)
    port: str
    passfile: str
    os_user: str


@dataclass(frozen=True)
class PrincipalCheck:
    principal: str
    ok: bool
    used_by: list[str] = field(default_factory=list)
    kind: str | None = None
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _passfile(dsn: str) -> str:
    """The password file libpq reads for a principal's login (the DSN's, PGPASSFILE, or ~/.pgpass)."""
    params = conninfo_to_dict(dsn)
    return str(params.get("passfile") or os.environ.get("PGPASSFILE") or Path("~/.pgpass").expanduser())


def fix_for(kind: str, message: str, principal: str, ctx: Context) -> str:
    """What to change so ``principal`` can log in, for a failure of ``kind`` (``message`` only tells
    password, pg_hba and ident failures apart; it is never echoed)."""
    db = ctx.database
    if kind == "no_password":
        return (f"add the line `{ctx.host}:{ctx.port}:{db}:{principal}:<password>` to the password file "
                f"{ctx.passfile} (mode 0600, owned by {ctx.os_user}, the daemon's OS user)")
    if kind == "login_not_permitted":
        return f"ALTER ROLE {principal} LOGIN (or let the jobs run as a role that may log in)"
    if kind == "undefined_role":
        return f"the role {principal} does not exist: create it, or alter or drop the jobs that run as it"
    if kind == "connect_privilege":
        return f"GRANT CONNECT ON DATABASE {db} TO {principal}"
    lowered = message.lower()
    if "pg_hba.conf" in lowered:
        line = (f"local {db} {principal} scram-sha-256" if ctx.client_addr is None
                else f"host {db} {principal} {ctx.client_addr}/32 scram-sha-256")
        return f"add `{line}` to pg_hba.conf, then SELECT pg_reload_conf()"
    if "peer authentication" in lowered or "ident authentication" in lowered:
        member = (f"; on PostgreSQL 16+ `radix {ctx.os_user} +<group role>` maps every member at once"
                  if ctx.server_major < 16 else f" (or `radix {ctx.os_user} +<group role>` for every member)")
        return (f"map the OS user {ctx.os_user} to {principal} in pg_ident.conf: `radix {ctx.os_user} "
                f"{principal}`{member}, with `map=radix` on the pg_hba.conf line, then SELECT pg_reload_conf()")
    if kind in ("authentication_failed", "invalid_password", "invalid_authorization_specification"):
        return (f"the password for {principal} in {ctx.passfile} is not the role's: correct the line "
                f"`{ctx.host}:{ctx.port}:{db}:{principal}:…` or ALTER ROLE {principal} PASSWORD …; "
                "check the pg_hba.conf line's method (scram-sha-256) too")
    return f"the server refused or was unreachable ({retry.truncate(message, 200)}): check host, port and pg_hba.conf"


async def _context(dsn: str) -> tuple[Context, list[tuple[str, list[str]]]]:
    async with await psycopg.AsyncConnection.connect(scheduler_dsn(dsn), autocommit=True,
                                                     connect_timeout=CONNECT_TIMEOUT_S) as conn:
        await abound_lock_waits(conn)
        cur = await conn.execute(CONTEXT)
        row = await cur.fetchone()
        assert row is not None
        if not row[8]:
            raise NotTheScheduler(row[6], row[7])
        cur = await conn.execute(PRINCIPALS)
        principals = [(str(r[0]), list(r[1])) for r in await cur.fetchall()]
        host, port = conn.info.host, str(conn.info.port)
    ctx = Context(row[0], row[1], int(row[2]), row[3], bool(row[4]), bool(row[5]),
                  "*" if host.startswith("/") else host, port, _passfile(dsn), getpass.getuser())
    return ctx, principals


async def _login(dsn: str, principal: str, used_by: list[str], ctx: Context,
                 limit: asyncio.Semaphore, timeout_s: int) -> PrincipalCheck:
    async with limit:
        try:
            conn = await psycopg.AsyncConnection.connect(
                principal_dsn(dsn, principal, connect_timeout_s=timeout_s), autocommit=True)
        except psycopg.OperationalError as exc:
            message = first_line(exc)
            cause = retry.classify(exc.sqlstate, message, connection_lost=True)
            return PrincipalCheck(principal, False, used_by, cause.kind, fix_for(cause.kind, message, principal, ctx))
        await conn.close()
    return PrincipalCheck(principal, True, used_by)


async def check_principals(dsn: str, *, timeout_s: int = CONNECT_TIMEOUT_S) -> tuple[Context, list[PrincipalCheck]]:
    """Log in as every principal in use; one result per principal, in name order."""
    ctx, principals = await _context(dsn)
    limit = asyncio.Semaphore(PARALLEL_LOGINS)
    checks = await asyncio.gather(*(_login(dsn, p, used, ctx, limit, timeout_s) for p, used in principals))
    return ctx, list(checks)


async def log_principal_checks(name: str, dsn: str) -> None:
    """``serve``'s start, once per database: a line per principal that cannot log in, or one that all can."""
    try:
        _, checks = await check_principals(dsn)
    except (psycopg.Error, OSError, NotTheScheduler) as exc:  # the owner reports the database itself
        log.warning("principal check skipped db=%s error=%s", name, retry.truncate(first_line(exc), 200))
        return
    failed = [c for c in checks if not c.ok]
    for check in failed:
        log.warning("principal cannot log in db=%s principal=%s kind=%s used_by=%s fix: %s", name,
                    check.principal, check.kind, len(check.used_by), check.fix,
                    extra={"fields": {"db": name, "principal": check.principal, "kind": check.kind}})
    if not failed:
        log.info("principal check db=%s principals=%s all can log in", name, len(checks))
