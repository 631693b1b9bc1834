"""Connections logged in as principals, kept per principal and cleaned before reuse.

Only ``session_user = principal`` keeps procedure code inside the principal's rights: SET ROLE and SET
SESSION AUTHORIZATION can be undone by the code they would contain (research: postgres-facts §1).

This is a deliberately small idle list rather than psycopg_pool: a login that fails (role dropped,
NOLOGIN, CONNECT revoked) must fail the attempt at once with PostgreSQL's reason, where a pool would
retry in the background and time out without it.

Invariants, against a principal who sets ``search_path`` (``ALTER ROLE self SET search_path = mine,
pg_catalog``) and defines ``mine.pg_advisory_unlock_all()``, ``mine.=`` or ``mine.set_config()``:
- every statement radixjobs sends on a principal's connection names its functions and operators with
  their schema (``pg_catalog.…``, ``OPERATOR(pg_catalog.=)``), so the principal's search_path and session
  defaults choose nothing in it;
- the clean is bounded (``CLEAN_TIMEOUT_S``, and a statement_timeout inside it): past that the connection
  is closed, never reused, and the backend ends within client_connection_check_interval;
- logins are bounded by ``connect_timeout``, and the session key read after a login (the backend's
  radix.attempt_session(), for attempt MACs: engine/attempt.py) by ``CLEAN_TIMEOUT_S``;
- a connection is cleaned before reuse: by ``clean()``, or by the clean that follows a committed atomic
  attempt in its own query (``mark_clean``: the identity check in it passed);
- every attempt of the engine (a claim, a lone tick, a batch) holds its connection through one context
  manager, ``PrincipalAttempt``: held until the attempt's outcome is recorded, closed when it could not be;
- a principal's password comes only from the password file (``passfile`` in the DSN, ``PGPASSFILE``, or
  ``~/.pgpass``), never from the scheduler's DSN nor from ``PGPASSWORD`` in the daemon's environment:
  the DSN carries an empty ``password``, which libpq reads as "none given" (so it looks in the password
  file, and sends no password when none is listed) while it hides ``PGPASSWORD`` (verified against
  PostgreSQL 15: tests/acceptance/test_external_cluster.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# A backend whose client vanished (daemon killed, or a clean timed out) notices within 250 ms and ends
# (its atomic attempt rolls back, and another node may run the tick: the failover time of atomic jobs).
PRINCIPAL_OPTIONS = "-c client_connection_check_interval=250"
CONNECT_TIMEOUT_S = 10
# A clean does no user code; it is slow only when something holds it up (a lock on the session's temp
# objects taken from another session of the principal): then the connection is dropped, not waited for.
CLEAN_TIMEOUT_S = 5.0

Conn = psycopg.AsyncConnection[Any]

# The backend's key for attempt MACs (engine/attempt.py), qualified: the principal's search_path is live.
SESSION_KEY = b"SELECT radix.attempt_session()"


def principal_dsn(dsn: str, principal: str, *, connect_timeout_s: int = CONNECT_TIMEOUT_S,
                  application_name: str = "radixjobs-attempt") -> str:
    """The scheduler's DSN, logged in as ``principal``: no password carried over, ``PGPASSWORD`` hidden
    (an explicit empty password), so the password file alone supplies the principal's."""
    params = conninfo_to_dict(dsn)
    params["password"] = ""
    params["user"] = principal
    params["options"] = PRINCIPAL_OPTIONS
    params["application_name"] = application_name
    params["connect_timeout"] = str(connect_timeout_s)
    return make_conninfo(**params)  # type: ignore[arg-type]


# DISCARD ALL without its DISCARD PLANS, and the identity check, in one round trip. DISCARD PLANS holds
# no session state a job could see, but it invalidates every cached plan of the session, so each next
# attempt re-planned all statements of radix.begin_attempt / end_attempt (~1 ms; docs/benchmarks.md).
# Sent as one simple query (one implicit transaction: a failure anywhere leaves the connection unused).
# Every name is qualified: RESET ALL restores the principal's own search_path before the rest runs. The
# SET LOCALs bound each following statement on the server, whatever the principal's own settings. The
# PRNG is reseeded from the OS, so a job's setseed() does not decide the next job's random(); the seed
# is a quoted literal, as a negative number would call the principal's prefix operator "-".
_CLEAN = ("CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; "
          "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}; "
          "DEALLOCATE ALL; UNLISTEN *; SELECT pg_catalog.pg_advisory_unlock_all(); DISCARD TEMP; "
          "DISCARD SEQUENCES; SELECT pg_catalog.setseed('{seed!r}'::pg_catalog.float8); "
          "SELECT CURRENT_USER OPERATOR(pg_catalog.=) SESSION_USER")


def clean_statement() -> bytes:
    """The clean, with a fresh seed for the session's PRNG."""
    seed = secrets.randbits(53) / float(1 << 53) * 2 - 1
    return _CLEAN.format(ms=int(CLEAN_TIMEOUT_S * 1000), seed=seed).encode()


async def clean(conn: Conn, timeout_s: float = CLEAN_TIMEOUT_S) -> bool:
    """Reset a returned connection; False when it cannot be reused (broken, identity changed, or the
    clean did not finish within ``timeout_s``).

    DEALLOCATE ALL drops prepared statements, so principal connections never auto-prepare.
    """
    if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    reset = asyncio.create_task(_reset(conn))
    done, _ = await asyncio.wait({reset}, timeout=timeout_s)
    if not done:
        # close the socket rather than cancel the query (psycopg would wait for the server to agree)
        conn.pgconn.finish()
        await asyncio.gather(reset, return_exceptions=True)
        return False
    return reset.result()


async def _reset(conn: Conn) -> bool:
    try:
        cur = await conn.execute(clean_statement(), prepare=False)
        row = await (await cur.set_result(-1)).fetchone()  # the identity check's result, the last one
    except psycopg.Error:
        return False
    return bool(row and row[0])


class LoginFailed(Exception):
    """A principal's connection could not be opened; ``error`` has PostgreSQL's reason."""

    def __init__(self, error: psycopg.OperationalError):
        super().__init__(str(error))
        self.error = error


class PrincipalAttempt:
    """One attempt's hold on a principal's connection, the one way every path of the engine opens one:
    ``async with pools.attempt(principal) as conn:`` logs in (or takes an idle connection; LoginFailed
    when it cannot log in), and the block runs the attempt and records its outcome. Leaving the block
    normally gives the connection back (cleaned before reuse); leaving it by an exception closes it: the
    attempt's query carried a MAC good on that backend while its token lives, so a connection whose
    attempt's outcome could not be recorded never serves another attempt."""

    __slots__ = ("_conn", "_pools", "_principal")

    def __init__(self, pools: PrincipalPools, principal: str):
        self._pools = pools
        self._principal = principal

    async def __aenter__(self) -> Conn:
        conn = self._pools.take_idle(self._principal)
        if conn is None:
            try:
                conn = await self._pools.connect(self._principal)
            except psycopg.OperationalError as exc:
                raise LoginFailed(exc) from exc
        self._conn = conn
        return conn

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc is not None:
            await self._conn.close()
        await self._pools.give_back(self._principal, self._conn)


class PrincipalPools:
    """Idle connections per principal (at most ``max_idle`` each), opened on demand."""

    def __init__(self, dsn: str, *, max_idle: int):
        self.dsn = dsn
        self.max_idle = max_idle
        self._idle: dict[str, list[Conn]] = {}
        self._session_keys: dict[Conn, bytes] = {}
        self._cleaned: set[Conn] = set()

    @contextlib.asynccontextmanager
    async def connection(self, principal: str) -> AsyncIterator[Conn]:
        """A clean autocommit connection logged in as ``principal``.

        Raises psycopg.OperationalError (PostgreSQL's reason in the message) when it cannot log in.
        """
        conn = self.take_idle(principal)
        if conn is None:
            conn = await self.connect(principal)
        try:
            yield conn
        finally:
            await self.give_back(principal, conn)

    def attempt(self, principal: str) -> PrincipalAttempt:
        """An attempt's hold on a connection of ``principal`` (``async with``): see PrincipalAttempt."""
        return PrincipalAttempt(self, principal)

    def take_idle(self, principal: str) -> Conn | None:
        """An idle connection of ``principal`` (clean), or None."""
        idle = self._idle.get(principal)
        return idle.pop() if idle else None

    async def give_back(self, principal: str, conn: Conn) -> None:
        """Keep ``conn`` for reuse once clean (at most ``max_idle`` of a principal), else close it."""
        if conn in self._cleaned:  # cleaned in the attempt's own query (engine/attempt.py)
            self._cleaned.discard(conn)
            reusable = not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        else:
            reusable = await clean(conn)
        idle = self._idle.setdefault(principal, [])
        if len(idle) < self.max_idle and reusable:
            idle.append(conn)
        else:
            await conn.close()
            self._session_keys.pop(conn, None)

    def mark_clean(self, conn: Conn) -> None:
        """``conn`` ran the clean (and its identity check passed) after its last statement of user code."""
        self._cleaned.add(conn)

    async def connect(self, principal: str) -> Conn:
        """A new connection: log in (psycopg.OperationalError when it cannot), then read the backend's
        session key (for attempt MACs) as the session's first statement, before any attempt ran on it;
        bounded like a clean."""
        conn = await psycopg.AsyncConnection.connect(principal_dsn(self.dsn, principal), autocommit=True,
                                                     prepare_threshold=None)
        try:
            async with asyncio.timeout(CLEAN_TIMEOUT_S):
                cur = await conn.execute(SESSION_KEY, prepare=False)
                row = await cur.fetchone()
        except (psycopg.Error, TimeoutError) as exc:
            await conn.close()
            raise psycopg.OperationalError(f"cannot start a session as {principal}: {exc}") from exc
        if row is None or not isinstance(row[0], str):
            await conn.close()
            raise psycopg.OperationalError(f"cannot start a session as {principal}: no session key")
        self._session_keys[conn] = bytes.fromhex(row[0])
        return conn

    def session_key(self, conn: Conn) -> bytes:
        """The radix.attempt_session() of a connection this pool opened."""
        return self._session_keys[conn]

    def backend_pids(self) -> list[int]:
        """The backends of every session open here (idle or running an attempt)."""
        return [conn.info.backend_pid for conn in self._session_keys if not conn.closed]

    def is_superuser(self, principal: str) -> bool | None:
        """Is ``principal`` a superuser, as its idle session reported at login (PostgreSQL sends
        is_superuser in the startup)? None when no session of it is idle here."""
        idle = self._idle.get(principal)
        return idle[-1].info.parameter_status("is_superuser") == "on" if idle else None

    async def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                await conn.close()
        self._idle.clear()
        self._session_keys.clear()
