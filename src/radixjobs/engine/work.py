"""Attempts of another target kind, run by an engine beside its ticks and claims: a source (the CRON_TABLE
documents, radixjobs.documents.runner) finds them, the engine's dispatcher gives each a slot and runs it.

The engine never imports a source: it declares here what it gives one (``WorkContext``) and what it asks of
one (``WorkSource``).

Invariants:
- an item runs only in a slot of the engine's InFlight, reserved before the source's look and released when
  the item's task is done, like every attempt: the node's and the database's concurrency count it;
- while it runs, an item counts for its principal in InFlight.tick_connections, the count the engine's cap
  per principal (``max_per_principal``) and its deal read for ticks too: one cap, one meaning, whatever runs;
- a source uses the engine's own pool, principal pools, node id and watchdog (``WorkContext``): no
  connection, registration or timer of its own beyond its items';
- a look takes at most ``limit`` items and none of a principal that ``running`` puts at its cap.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg_pool import AsyncConnectionPool

from radixjobs.engine.principals import PrincipalPools

# ``watch(conn, limit_s)``: what runs on ``conn`` inside the block is cancelled past ``limit_s`` (or when
# the engine is cancelled) and its backend ended after the engine's grace (AttemptRunner.watch).
Watch = Callable[[psycopg.AsyncConnection[Any], float], AbstractAsyncContextManager[None]]


@dataclass(frozen=True)
class WorkContext:
    """What an engine lends a source: its pool (its own role), its principals' connections, its node id,
    its watchdog, its counters (a source adds its own fixed set of keys), and its cancel."""

    pool: AsyncConnectionPool[Any]
    principals: PrincipalPools
    node_id: str
    watch: Watch
    counters: Counter[str]
    cancel: asyncio.Event  # set when the engine cancels its attempts (shutdown past its grace)


@dataclass(frozen=True)
class Work:
    """One item to run in a slot: ``run`` is called once, in its own task; ``principal`` (a role oid) is the
    principal it runs as, for the cap."""

    principal: int
    run: Callable[[], Awaitable[None]]


class WorkSource(Protocol):
    """Work of another target kind (``Engine(dsn, work=source)``)."""

    def bind(self, context: WorkContext) -> None:
        """Called once, when the engine starts, before any look."""

    async def look(self, limit: int, running: Mapping[int, int], cap: int) -> list[Work]:
        """Up to ``limit`` items due now, none of a principal at ``cap`` (0: none) with ``running`` its
        attempts running on this node; round trips on the context's pool only."""

    def due_in(self) -> float | None:
        """Seconds until the next look should happen (0: now), without a query; None: only when poked."""

    def poke(self) -> None:
        """A notification came (the source's data changed): look at the next dispatch."""

    async def close(self) -> None:
        """The engine is closing, its items' tasks are done or being cancelled: stop what the source runs
        outside the database (worker processes)."""

