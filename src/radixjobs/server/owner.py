"""One owner task per database: an engine (its jobs and its CRON_TABLE documents), a LISTEN connection, a
precise timer, reconnects."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg

from radixjobs.db import first_line
from radixjobs.documents.runner import Documents
from radixjobs.engine import Engine
from radixjobs.engine.batches import BATCH_MAX
from radixjobs.engine.leases import DEFAULT_LEASE_S
from radixjobs.engine.nodes import CHANNELS, listen
from radixjobs.engine.slots import Slots
from radixjobs.fairness import LONG_ATTEMPT_S
from radixjobs.observe import Observer
from radixjobs.preflight import log_principal_checks
from radixjobs.server.events import EVENTS_CHANNEL, EventPoster, parse_event

log = logging.getLogger("radixjobs.server")

UNCLAIMABLE_PAUSE_S = 0.01


class DatabaseOwner:
    """Runs a database's due work until stopped; notifications are hints, the timer and poll are truth."""

    def __init__(self, name: str, dsn: str, *, node_id: str, slots: Slots, concurrency: int,
                 poll_s: float = 1.0, grace_s: float = 5.0, services: Mapping[str, str] | None = None,
                 max_per_principal: int | None = None, lease_s: int = DEFAULT_LEASE_S,
                 tick_batch: int = BATCH_MAX, reserved_slots: int | None = None,
                 long_attempt_s: float = LONG_ATTEMPT_S):
        self.name = name
        self.reserved_slots = reserved_slots
        self.long_attempt_s = long_attempt_s
        self.lease_s = lease_s
        self.tick_batch = tick_batch
        self.dsn = dsn
        self.node_id = node_id
        self.slots = slots
        self.concurrency = concurrency
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.max_per_principal = max_per_principal
        self.engine: Engine | None = None
        self.documents: Documents | None = None  # the documents of the engine serving now
        self.services = dict(services or {})
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.reachable = asyncio.Event()  # set by the daemon's discovery when PostgreSQL is reachable again
        self.connected = False
        self.last_error: str | None = None
        self.reconnects = 0
        self.owner_errors = 0  # unexpected (non-connection) errors the owner restarted after
        self.engines_counters: list[dict[str, int]] = []  # counters of engines replaced after errors
        self._preflight: asyncio.Task[None] | None = None
        self.observer: Observer | None = None  # given to its engine and its documents
        self.events: EventPoster | None = None  # serve --notify-url: radix_events are handed to it

    async def run(self) -> None:
        """Serve until ``stop``; reconnect with jittered exponential backoff on connection loss."""
        # once per database, beside the serving: which principals cannot log in, and the fix (preflight)
        self._preflight = self._preflight or asyncio.create_task(log_principal_checks(self.name, self.dsn))
        backoff = 0.2
        while not self.stopping.is_set():
            try:
                await self._serve()
                return
            except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
                self.reachable.clear()  # only discovery's look from now on may cut the backoff short
                if self.connected:  # it was serving: a new outage (a failover) starts the backoff afresh
                    backoff = 0.2
                self.connected = False
                self.last_error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                log.warning("database connection lost db=%s node=%s error=%s; reconnecting in %.1fs",
                            self.name, self.node_id, self.last_error, backoff)
                await self._drop_engine()
                self.reconnects += 1
                await self._backoff(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 10.0)
            except Exception as exc:  # anything else (a bug, an unexpected answer): logged, counted, retried
                self.connected = False
                self.owner_errors += 1
                log.error("database owner failed db=%s node=%s error=%s: %s; restarting in %.1fs", self.name,
                          self.node_id, type(exc).__name__, first_line(exc), backoff, exc_info=exc,
                          extra={"fields": {"db": self.name, "node": self.node_id, "error": type(exc).__name__}})
                await self._drop_engine()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 10.0)

    async def _backoff(self, seconds: float) -> None:
        """Wait before reconnecting: ``seconds``, or less when stopped or when discovery saw PostgreSQL
        reachable again (``reachable``: after a failover, the new primary is used as soon as found)."""
        waits = [asyncio.ensure_future(self.stopping.wait()), asyncio.ensure_future(self.reachable.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _serve(self) -> None:
        documents = Documents(services=self.services)
        documents.observer = self.observer
        engine = Engine(self.dsn, node_id=self.node_id, concurrency=self.concurrency, grace_s=5.0,
                        shared_slots=self.slots, finished=self.wake, max_per_principal=self.max_per_principal,
                        lease_s=self.lease_s, tick_batch=self.tick_batch, reserved_slots=self.reserved_slots,
                        long_attempt_s=self.long_attempt_s, work=documents)
        engine.observer = self.observer
        await engine.start()
        self.engine, self.documents = engine, documents
        listener = await listen(self.dsn, (*CHANNELS, EVENTS_CHANNEL) if self.events is not None else CHANNELS)
        try:
            self.connected = True
            notify_task = asyncio.create_task(self._listen(listener))
            try:
                await self._loop(engine, notify_task)
            finally:
                notify_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
                    await notify_task
        finally:
            await listener.close()
        await engine.shutdown(self.grace_s)
        self.engine = self.documents = None

    async def _loop(self, engine: Engine, notify_task: asyncio.Task[None]) -> None:
        while not self.stopping.is_set():
            if notify_task.done():  # the LISTEN connection broke: reconnect everything
                notify_task.result()
                raise psycopg.OperationalError("notification connection closed")
            # cleared before claiming: an attempt ending or a notification meanwhile must wake the sleep
            self.wake.clear()
            await engine.dispatch_due()
            await self._sleep(self._sleep_s(engine))

    def _sleep_s(self, engine: Engine) -> float:
        """Until the next due tick, known from the claim's own round trip (no query here); while every
        slot is busy, until an attempt ends; a short pause when due ticks were left that could not be
        claimed (locked or still running elsewhere), so that is not a busy loop."""
        due_in = engine.due_in()
        if due_in is None or not engine.has_free_slot:
            return self.poll_s
        if due_in > 0:
            return min(due_in, self.poll_s)
        return 0.0 if engine.claim_filled else min(UNCLAIMABLE_PAUSE_S, self.poll_s)

    async def _sleep(self, seconds: float) -> None:
        """Until the next due tick, a notification, a finished attempt (the engine sets ``wake`` too), or
        stop: one event and a timer, no task per sleep."""
        if seconds <= 0 or self.stopping.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.wake.wait()

    async def _listen(self, listener: psycopg.AsyncConnection[Any]) -> None:
        async for notify in listener.notifies():
            if notify.channel == EVENTS_CHANNEL:  # a tick failed for good: for --notify-url, never a wake-up
                event = parse_event(self.name, notify.payload)
                if event is not None and self.events is not None:
                    self.events.offer(event, self._failed_job_name)
                continue
            if self.engine is not None:
                self.engine.poke()
            self.wake.set()

    async def _failed_job_name(self, job_id: uuid.UUID, planned_ns: int, attempt: int, run_kind: str) -> str | None:
        """An event checked against the history by the engine serving now (None: not recorded, or no engine)."""
        engine = self.engine
        return None if engine is None else await engine.failed_job_name(job_id, planned_ns, attempt, run_kind)

    async def _drop_engine(self) -> None:
        """After a connection failure: abandon the engine, keep its counts."""
        engine, self.engine, self.documents = self.engine, None, None
        if engine is not None:
            self.engines_counters.append(dict(engine.counters))
            engine.cancel.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(engine.close(), 10)

    def stop(self) -> None:
        self.stopping.set()
        if self._preflight is not None:
            self._preflight.cancel()
        self.wake.set()

    def counters(self) -> dict[str, int]:
        """This database's counters since the daemon started (across reconnects)."""
        total: dict[str, int] = {}
        sources = [*self.engines_counters, *([dict(self.engine.counters)] if self.engine else [])]
        for source in sources:
            for key, value in source.items():
                total[key] = total.get(key, 0) + value
        return total

    @property
    def running(self) -> int:
        return self.engine.running if self.engine else 0
