"""Connections logged in as principals, kept per principal and cleaned before reuse.

Only ``session_user = principal`` keeps procedure code inside the principal's rights: SET ROLE and SET
SESSION AUTHORIZATION can be undone by the code they would contain (research: postgres-facts §1).

This is a deliberately small idle list rather than psycopg_pool: a login that fails (role dropped,
NOLOGIN, CONNECT revoked) must fail the attempt at once with PostgreSQL's reason, where a pool would
retry in the background and time out without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# A backend whose client vanished (daemon killed) notices within a second and aborts the attempt.
PRINCIPAL_OPTIONS = "-c client_connection_check_interval=1000"

Conn = psycopg.AsyncConnection[Any]


def principal_dsn(dsn: str, principal: str) -> str:
    """The scheduler's DSN, logged in as ``principal`` (no password carried over)."""
    params = conninfo_to_dict(dsn)
    params.pop("password", None)
    params["user"] = principal
    params["options"] = PRINCIPAL_OPTIONS
    params["application_name"] = "radixjobs-attempt"
    return make_conninfo(**params)  # type: ignore[arg-type]


# DISCARD ALL without its DISCARD PLANS, and the identity check, in one round trip. DISCARD PLANS holds
# no session state a job could see, but it invalidates every cached plan of the session, so each next
# attempt re-planned all statements of radix.begin_attempt / end_attempt (~1 ms; docs/benchmarks.md).
# Sent as one simple query (one implicit transaction: a failure anywhere leaves the connection unused).
CLEAN = (b"CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DEALLOCATE ALL; UNLISTEN *; "
         b"SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES; "
         b"SELECT current_user = session_user")


async def clean(conn: Conn) -> bool:
    """Reset a returned connection; False when it cannot be reused (broken, or identity changed).

    DEALLOCATE ALL drops prepared statements, so principal connections never auto-prepare.
    """
    if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    try:
        cur = await conn.execute(CLEAN, prepare=False)
        while cur.nextset():  # to the identity check's result, the last one
            pass
        row = await cur.fetchone()
    except psycopg.Error:
        return False
    return bool(row and row[0])


class PrincipalPools:
    """Idle connections per principal (at most ``max_idle`` each), opened on demand."""

    def __init__(self, dsn: str, *, max_idle: int):
        self.dsn = dsn
        self.max_idle = max_idle
        self._idle: dict[str, list[Conn]] = {}

    @contextlib.asynccontextmanager
    async def connection(self, principal: str) -> AsyncIterator[Conn]:
        """A clean autocommit connection logged in as ``principal``.

        Raises psycopg.OperationalError (PostgreSQL's reason in the message) when it cannot log in.
        """
        idle = self._idle.setdefault(principal, [])
        conn = idle.pop() if idle else await psycopg.AsyncConnection.connect(
            principal_dsn(self.dsn, principal), autocommit=True, prepare_threshold=None)
        try:
            yield conn
        finally:
            if len(idle) < self.max_idle and await clean(conn):
                idle.append(conn)
            else:
                await conn.close()

    async def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                await conn.close()
        self._idle.clear()
