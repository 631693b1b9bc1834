"""Imported jobs created by their pg_cron users: one session logged in as each user, bounded.

An imported job is admitted exactly as if its pg_cron user had typed the CREATE JOB on its own session.

Invariants:

- The wrapper and the job are created on a session whose ``session_user`` is the row's ``username``: every
  expression, conversion and lookup of admission (a domain's CHECK, a cast, an overload) runs with that
  user's rights, never the importer's. SET ROLE is never used: under a superuser session, code it
  contained could undo it. The importer's own connection serves the rows of the importer itself.
- A session logs in with ``principal_dsn`` (the importer's DSN without its password: the password file alone
  supplies the user's), bounded by ``connect_timeout``; one at a time, reused across the user's rows. A
  login that fails is that user's reason, with libpq's first line.
- The session keeps the user's own settings, search_path included, as the user's own session would
  (admission pins its own search_path); every statement sent there is schema-qualified. Each transaction
  first bounds itself (``statement_timeout``, ``lock_timeout`` SET LOCAL), and a watchdog shuts the socket
  down when user code outlasts ``WATCHDOG_S`` anyway (a function that catches the cancel): the session is
  then dropped, and its backend ends within client_connection_check_interval.
- The wrapper is created fresh (CREATE PROCEDURE, never OR REPLACE) once no routine of its name is in the
  schema, whatever its arguments (one of the same signature would be reused, an overload would make the
  CALL ambiguous): one there is a refusal naming it and its owner. Its COMMENT says where it came from,
  for people; nothing reads it back.
- A job of the same name the user sees is never replaced: "exists" when it runs as the user, else refused
  (the importer looked first; a role that is not an operator sees only its own jobs).
- One transaction per job: a refusal, or a dry run, rolls the wrapper and the job back together. When the
  schema is not ready for the user (a dry run before the import created it, or granted the user CREATE on
  it), both are admitted in the user's temporary schema instead, then rolled back: the same admission,
  nothing written.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from radixjobs import catalog
from radixjobs.db import first_line, lock_timeout_ms
from radixjobs.engine.principals import principal_dsn
from radixjobs.errors import RadixError
from radixjobs.imports.pg_cron_plan import JobPlan, Outcome
from radixjobs.model import CreateJob, QualifiedName

Conn = psycopg.Connection[Any]
APPLICATION_NAME = "radixjobs-import"
STATEMENT_TIMEOUT_MS = 30_000
WATCHDOG_S = 120.0  # a whole job's transaction: a few statements, each under the statement timeout

BOUND = (b"SELECT pg_catalog.set_config('statement_timeout', %s::pg_catalog.text, true), "
         b"pg_catalog.set_config('lock_timeout', %s::pg_catalog.text, true)")
ROUTINE_NAMED = b"""
SELECT pg_catalog.format('%%I.%%I(%%s)', n.nspname, p.proname, pg_catalog.oidvectortypes(p.proargtypes)),
       pg_catalog.pg_get_userbyid(p.proowner)
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
WHERE n.nspname OPERATOR(pg_catalog.=) %s::pg_catalog.name AND p.proname OPERATOR(pg_catalog.=) %s::pg_catalog.name
ORDER BY p.oid LIMIT 1
"""
# Creating a temporary object makes the session's temporary schema, whose name the second query reads.
TEMPORARY_SCHEMA = (b"CREATE TEMPORARY SEQUENCE IF NOT EXISTS pg_temp.radixjobs_import",
                    b"SELECT n.nspname::pg_catalog.text FROM pg_catalog.pg_namespace n "
                    b"WHERE n.oid OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()")


class LoginFailed(RadixError):
    """The importer cannot log in as a pg_cron user; the message says why."""


class Sessions:
    """Sessions logged in as pg_cron users, opened on demand; at most one open at a time (asking for another
    user's closes it), so a thousand users never take a thousand connections: take each user's rows in turn."""

    def __init__(self, importer: Conn, dsn: str):
        self.importer = importer
        self.dsn = dsn
        row = importer.execute("SELECT SESSION_USER::pg_catalog.text, CURRENT_USER::pg_catalog.text").fetchone()
        assert row is not None
        self.importer_user = str(row[0]) if row[0] == row[1] else None  # (not after a SET ROLE)
        self._open: tuple[str, Conn] | None = None
        self._failed: dict[str, str] = {}

    def get(self, user: str) -> Conn:
        """A session logged in as ``user`` (the importer's own connection for the importer); LoginFailed."""
        if user == self.importer_user:
            return self.importer
        if user in self._failed:
            raise LoginFailed(self._failed[user])
        if self._open is not None and self._open[0] == user:
            return self._open[1]
        self.close()
        try:
            conn = psycopg.connect(principal_dsn(self.dsn, user, application_name=APPLICATION_NAME),
                                   autocommit=True, prepare_threshold=None)
        except psycopg.OperationalError as exc:
            self._failed[user] = f"cannot log in as role {user}: {first_line(exc)}"
            raise LoginFailed(self._failed[user]) from None
        self._open = (user, conn)
        return conn

    def close(self) -> None:
        """Close the open session (also when broken, or cut by the watchdog); the next get() logs in again."""
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def __enter__(self) -> Sessions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Watchdog:
    """Shuts ``conn``'s socket down when the block outlasts ``seconds``: a wait on the server returns with
    an error, and the server ends the backend when it sees the client gone. Never after the block ended."""

    def __init__(self, conn: Conn, seconds: float):
        self.conn = conn
        self.fired = False
        self._done = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    def _cut(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


def existing(conn: Conn, job: JobPlan) -> Outcome | None:
    """The outcome for a job whose name is taken, as far as ``conn``'s role sees (None: not seen): left alone
    when it runs as the row's user, else refused, naming who it runs as."""
    found = catalog.get_job(conn, job.name)
    if found is None:
        return None
    principal, owner = found["principal"], found["owner"]
    if principal == job.principal:
        return job.outcome("exists", "a job of this name exists; left as it is")
    return job.outcome("refused", f"a job of this name exists, RUN AS {principal} (owner {owner}), not as "
                                  f"{job.principal}: drop it, or import into another --schema")


def admit(session: Conn, job: JobPlan, *, ready: bool, dry_run: bool, timeout_ms: int | None) -> Outcome | None:
    """Create ``job`` (and its wrapper) on ``session`` in one transaction, rolled back for a dry run or when
    the schema is not ready (then admitted in the session's temporary schema). None when admitted; the
    outcome when the user sees a job of its name already. Raises RadixError or psycopg.Error when refused."""
    with Watchdog(session, WATCHDOG_S) as watchdog:
        try:
            with session.transaction() as tx:
                session.execute(BOUND, (f"{STATEMENT_TIMEOUT_MS}ms", f"{lock_timeout_ms()}ms"))
                taken = existing(session, job)  # one the importer may not see, but its user does
                if taken is not None:
                    return taken
                name = job.name if ready else QualifiedName(_temporary_schema(session), job.name.name)
                if job.command.body is not None:
                    _create_wrapper(session, name, job)
                stmt = CreateJob(name, job.schedule, job.principal, job.command.procedure or name,
                                 job.command.arguments, enabled=job.row.active)
                catalog.create_job(session, stmt, deadline_ms=timeout_ms)
                if dry_run or not ready:
                    raise psycopg.Rollback(tx)
        except (RadixError, psycopg.Error):
            if watchdog.fired:
                raise RadixError(f"admission as {job.principal} did not finish within {WATCHDOG_S:g} s; its "
                                 "session was closed") from None
            raise
    return None


def _temporary_schema(session: Conn) -> str:
    make, read = TEMPORARY_SCHEMA
    session.execute(make)
    row = session.execute(read).fetchone()
    assert row is not None
    return str(row[0])


def _create_wrapper(session: Conn, name: QualifiedName, job: JobPlan) -> None:
    """The command as ``name()``, created fresh by the user (its owner), not executable by PUBLIC."""
    found = session.execute(ROUTINE_NAMED, (name.schema, name.name)).fetchone()
    if found is not None:
        raise RadixError(f"routine {found[0]} exists, owned by role {found[1]}: the import creates each wrapper "
                         "fresh and never reuses one; drop it, or import into another --schema")
    assert job.command.body is not None
    signature = sql.SQL("{}.{}()").format(sql.Identifier(name.schema), sql.Identifier(name.name))
    session.execute(sql.SQL("CREATE PROCEDURE {} LANGUAGE plpgsql AS {}").format(
        signature, sql.Literal(job.command.body)))
    origin = f"radixjobs: imported from pg_cron job {job.row.jobid}" + (
        f" ({job.row.jobname})" if job.row.jobname else "")
    session.execute(sql.SQL("COMMENT ON PROCEDURE {} IS {}").format(signature, sql.Literal(origin)))
    session.execute(sql.SQL("REVOKE ALL ON PROCEDURE {} FROM PUBLIC").format(signature))
