"""Lease renewal: a node keeps the claims of the attempts it runs for as long as it runs them.

Invariants:
- A claim's lease lasts ``lease_s`` seconds from the claim (radix.claim_due); while the attempt runs and
  the node is alive, one batched, token-fenced UPDATE (radix.renew_leases) from the scheduler's own
  connection extends every running lease of this node, every ``lease_s / 3`` seconds. So the lease bounds
  how long a dead node's claim blocks a job, never how long an attempt may run (its timeout does).
- A token the renewal does not return is a lost lease (ALTER JOB re-armed the job, DROP JOB CASCADE, or
  this node was declared dead): the attempt is ended (``lose(token)``, a backend termination from the
  scheduler's connection), since it could no longer record its outcome.
- A failed renewal (connection trouble, a lock wait past its bound) loses nothing: it is logged and tried
  again at the next period, well within the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

log = logging.getLogger("radixjobs.engine")

DEFAULT_LEASE_S = 300  # the seed's five minutes
RENEW = ("SELECT t FROM radix.renew_leases(%s::pg_catalog.text, %s::pg_catalog.uuid[], %s::pg_catalog.int4)"
         " AS r(t)")


class LeaseKeeper:
    """Renews the leases of ``held()`` (tokens of attempts in progress) and calls ``lose(token)`` for
    each one that is gone."""

    def __init__(self, pool: AsyncConnectionPool[Any], node_id: str, lease_s: int,
                 held: Callable[[], set[uuid.UUID]], lose: Callable[[uuid.UUID], object]):
        self.pool = pool
        self.node_id = node_id
        self.lease_s = lease_s
        self.period_s = max(lease_s / 3, 0.2)
        self.held = held
        self.lose = lose
        self.renewals = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"leases:{self.node_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.renew()
            except (psycopg.Error, OSError) as exc:
                log.warning("lease renewal failed node=%s error=%s", self.node_id, str(exc).strip()[:200])

    async def renew(self) -> set[uuid.UUID]:
        """One renewal of every held lease; returns the tokens found lost (and ended)."""
        tokens = self.held()
        if not tokens:
            return set()
        async with self.pool.connection() as conn:
            cur = await conn.execute(RENEW, (self.node_id, list(tokens), self.lease_s))
            kept = {row[0] for row in await cur.fetchall()}
        self.renewals += 1
        # an attempt that ended meanwhile (its token cleared by its own finalisation) is not lost
        lost = (tokens - kept) & self.held()
        for token in lost:
            log.warning("lease lost while running: ending the attempt node=%s", self.node_id)
            self.lose(token)
        return lost
