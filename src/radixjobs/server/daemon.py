"""``radixjobs serve``: owners for every ready database, discovery, HTTP status, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import signal
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from radixjobs import migrate, observe, retry
from radixjobs.db import first_line, scheduler_dsn
from radixjobs.documents.scheduler import COUNTER_KEYS as DOCUMENT_COUNTER_KEYS
from radixjobs.engine.leases import DEFAULT_LEASE_S
from radixjobs.engine.runner import COUNTER_KEYS
from radixjobs.engine.slots import Slots
from radixjobs.server.owner import DatabaseOwner

log = logging.getLogger("radixjobs.server")

DOCUMENT_SQLSTATE = re.compile(r"\[([0-9A-Z]{5})\]")
LIST_DATABASES = "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate ORDER BY datname"


@dataclass
class DaemonConfig:
    dsn: str
    all_databases: bool = False
    node_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    concurrency: int = 32
    per_database_concurrency: int = 8
    max_per_principal: int | None = None  # running attempts per principal and database; None: half the above
    grace_s: float = 30.0
    poll_s: float = 1.0
    discovery_s: float = 5.0
    services: dict[str, str] = field(default_factory=dict)  # CSP services allowed besides entry points
    lease_s: int = DEFAULT_LEASE_S  # claim lease, renewed every third of it while the attempt runs


def dsn_for_database(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


async def is_ready(dsn: str, *, unreachable_raises: bool = False) -> bool:
    """Is radixjobs installed there at exactly this code's schema version? A server that cannot be reached
    is not ready, or (``unreachable_raises``) raises its psycopg.OperationalError."""
    try:
        conn = await psycopg.AsyncConnection.connect(scheduler_dsn(dsn), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError:
        if unreachable_raises:
            raise
        return False
    try:
        async with conn:
            cur = await conn.execute(migrate.VERSION_PROBE)
            probe = await cur.fetchone()
            if not (probe and probe[0]):
                return False
            query = migrate.version_query(probe)
            if query is None:
                return False
            cur = await conn.execute(query)
            row = await cur.fetchone()
    except psycopg.Error:
        return False
    return bool(row and row[0] == migrate.code_version())


def public_error(source: str, record: dict[str, Any]) -> dict[str, str]:
    """What /status says about a failure: where (job or document), its category and its kind (a
    SQLSTATE condition name or one of ours), all from fixed vocabularies."""
    if "category" in record and "kind" in record:  # an attempt failure: classified already
        cause = retry.Cause(str(record["kind"]), retry.Category(record["category"]), False)
    else:  # a document run's one-line text: "[SQLSTATE] …" when PostgreSQL raised it
        match = DOCUMENT_SQLSTATE.search(str(record.get("error", "")))
        cause = retry.classify(match[1] if match else None)
    return {"source": source, "category": str(cause.category), "kind": cause.kind}


class Daemon:
    """The scheduler daemon of one node. ``tracing``: OpenTelemetry (default: as the OTEL_* environment
    asks, radixjobs.observe.load_tracing)."""

    def __init__(self, config: DaemonConfig, tracing: observe.Tracing | None = None):
        config.dsn = scheduler_dsn(config.dsn)
        self.config = config
        self.slots = Slots(config.concurrency)
        self.owners: dict[str, tuple[DatabaseOwner, asyncio.Task[None]]] = {}
        self.started_at = time.monotonic()
        self.stopping = asyncio.Event()
        self.last_error: dict[str, Any] | None = None
        self.reachable: bool | None = None  # None until the first look
        self._reload_task: asyncio.Task[None] | None = None
        self.reloader: Callable[[], Coroutine[Any, Any, None]] | None = None  # SIGHUP (server/reload.py)
        self.latencies = observe.Latencies()  # /metrics' histograms
        self.tracing = tracing if tracing is not None else observe.load_tracing()

    # -- discovery -------------------------------------------------------------------------------
    async def ready_databases(self) -> list[str]:
        """The databases to serve: the DSN's own, or every ready one of the cluster."""
        if not self.config.all_databases:
            name = conninfo_to_dict(self.config.dsn).get("dbname") or "postgres"
            return [str(name)] if await is_ready(self.config.dsn, unreachable_raises=True) else []
        async with await psycopg.AsyncConnection.connect(self.config.dsn, autocommit=True) as conn:
            cur = await conn.execute(LIST_DATABASES)
            names = [row[0] for row in await cur.fetchall()]
        checks = await asyncio.gather(*(is_ready(dsn_for_database(self.config.dsn, n)) for n in names))
        return [name for name, ready in zip(names, checks, strict=True) if ready]

    async def discover(self) -> None:
        """Start owners for new ready databases; stop those of databases that are gone or not ready."""
        try:
            ready = set(await self.ready_databases())
        except psycopg.Error as exc:
            self._reachability(False, first_line(exc))
            return
        self._reachability(True)
        for name in sorted(ready - self.owners.keys()):
            self._start_owner(name)
        for name in sorted(self.owners.keys() - ready):
            owner, task = self.owners.pop(name)
            log.info("database no longer ready db=%s node=%s", name, self.config.node_id)
            owner.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, self.config.grace_s + 10)

    def _start_owner(self, name: str) -> None:
        dsn = dsn_for_database(self.config.dsn, name) if self.config.all_databases else self.config.dsn
        owner = DatabaseOwner(name, dsn, node_id=self.config.node_id, slots=self.slots,
                              concurrency=self.config.per_database_concurrency, poll_s=self.config.poll_s,
                              grace_s=self.config.grace_s, services=self.config.services,
                              max_per_principal=self.config.max_per_principal, lease_s=self.config.lease_s)
        owner.observer = observe.Observer(name, self.latencies, self.tracing)
        self.owners[name] = (owner, asyncio.create_task(owner.run(), name=f"owner:{name}"))
        log.info("serving database db=%s node=%s", name, self.config.node_id)

    def _reachability(self, reachable: bool, error: str = "") -> None:
        """Log once per state change: PostgreSQL became unreachable, or reachable again."""
        before, self.reachable = self.reachable, reachable
        if reachable and before is False:
            for owner, _ in self.owners.values():  # reconnect now, not when the backoff ends (a failover)
                owner.reachable.set()
            log.info("PostgreSQL is reachable again node=%s", self.config.node_id,
                     extra={"fields": {"event": "postgres_reachable", "node": self.config.node_id}})
        elif not reachable and before is not False:
            log.warning("PostgreSQL is not reachable node=%s error=%s; retrying with backoff (up to every %gs)",
                        self.config.node_id, error, self.config.discovery_s,
                        extra={"fields": {"event": "postgres_unreachable", "node": self.config.node_id}})

    def is_healthy(self) -> tuple[bool, str]:
        """/healthz: serving (PostgreSQL reachable and, for one database, that database served)."""
        if self.stopping.is_set():
            return False, "stopping"
        if not self.reachable:
            return False, "not ready: PostgreSQL is not reachable"
        if not self.config.all_databases and not self.owners:
            return False, "not ready: the database is not ready (radixjobs install)"
        return True, "ok"

    # -- lifecycle -------------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve until stop(): rediscover databases periodically; while PostgreSQL cannot be reached, look
        again with jittered exponential backoff (0.2 s up to --discovery-interval)."""
        backoff = 0.2
        while not self.stopping.is_set():
            await self.discover()
            if self.reachable:
                backoff, wait_s = 0.2, self.config.discovery_s
            else:
                wait_s = min(backoff, self.config.discovery_s) * (0.5 + random.random() / 2)
                backoff = min(backoff * 2, self.config.discovery_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), wait_s)
        await self.shutdown()

    def stop(self) -> None:
        self.stopping.set()

    async def shutdown(self) -> None:
        """Stop claiming everywhere, let running attempts finish within the grace, release, close."""
        for owner, _ in self.owners.values():
            owner.stop()
        tasks = [task for _, task in self.owners.values()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.tracing is not None:  # the last spans and metrics, exported off the event loop
            await asyncio.to_thread(self.tracing.close)

    def install_signal_handlers(self) -> None:
        """First SIGINT/SIGTERM: clean shutdown. Second: exit at once."""
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            if self.stopping.is_set():
                log.warning("second signal: exiting now")
                os._exit(130)
            log.info("signal %s: shutting down (grace %.0fs)", signal.Signals(signum).name, self.config.grace_s)
            self.stop()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, self._on_hangup)

    def _on_hangup(self) -> None:
        """SIGHUP: reload (one at a time; running attempts are untouched)."""
        if self.reloader is None or self.stopping.is_set():
            return
        if self._reload_task is not None and not self._reload_task.done():
            log.warning("SIGHUP: a reload is still in progress; ignored")
            return
        log.info("SIGHUP: reloading the configuration and the CSP services")
        self._reload_task = asyncio.create_task(self.reloader(), name="reload")

    # -- status ----------------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        total = dict.fromkeys((*COUNTER_KEYS, *DOCUMENT_COUNTER_KEYS), 0)
        for owner, _ in self.owners.values():
            for key, value in owner.counters().items():
                if key in total:
                    total[key] += value
        return total

    def status(self) -> dict[str, Any]:
        """The /status document: a bounded, fixed set of keys whatever the number of jobs and errors.

        Anyone who can reach the port reads it, without logging in to PostgreSQL: it carries categories
        and counts only, never an error text, a job or document name, or an argument (those stay in the
        history, where PostgreSQL's row visibility decides who reads them)."""
        databases = []
        last_error = None
        for name, (owner, _) in sorted(self.owners.items()):
            databases.append({"name": name, "connected": owner.connected, "running_attempts": owner.running,
                              "reconnects": owner.reconnects, "owner_errors": owner.owner_errors})
            if owner.engine is not None and owner.engine.last_error is not None:
                last_error = public_error("job", owner.engine.last_error)
            if owner.documents is not None and owner.documents.last_error is not None:
                last_error = public_error("document", owner.documents.last_error)
        return {
            "node": self.config.node_id,
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "version": migrate.code_version(),
            "databases": databases,
            "counters": self.counters(),
            "running_attempts": sum(owner.running for owner, _ in self.owners.values()),
            "last_error": last_error,
        }
