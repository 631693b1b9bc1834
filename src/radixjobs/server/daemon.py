"""``radixjobs serve``: owners for every ready database, discovery, HTTP status, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

from radixjobs import migrate, observe, retry
from radixjobs.db import scheduler_dsn
from radixjobs.documents.runner import COUNTER_KEYS as DOCUMENT_COUNTER_KEYS
from radixjobs.engine.runner import COUNTER_KEYS
from radixjobs.engine.slots import Slots
from radixjobs.latency import Latencies
from radixjobs.server.clusters import Cluster, cluster_health, make_clusters
from radixjobs.server.config import DaemonConfig
from radixjobs.server.events import COUNTER_KEYS as EVENT_COUNTER_KEYS
from radixjobs.server.events import EventPoster
from radixjobs.server.owner import DatabaseOwner

log = logging.getLogger("radixjobs.server")



def public_error(source: str, record: dict[str, Any]) -> dict[str, str]:
    """What /status says about a failure: where (job or document), its category and its kind (a
    SQLSTATE condition name or one of ours), all from fixed vocabularies."""
    if "category" in record and "kind" in record:  # an attempt failure: classified already
        cause = retry.Cause(str(record["kind"]), retry.Category(record["category"]), False)
    else:  # a document run's one-line text: "[SQLSTATE] …" when PostgreSQL raised it
        cause = retry.classify_document_error(str(record.get("error", "")))
    return {"source": source, "category": str(cause.category), "kind": cause.kind}


class Daemon:
    """The scheduler daemon of one node: one supervisor per target (server/clusters.py). ``tracing``:
    OpenTelemetry (default: as the OTEL_* environment asks, radixjobs.observe.load_tracing)."""

    def __init__(self, config: DaemonConfig, tracing: observe.Tracing | None = None):
        config.dsn = scheduler_dsn(config.dsn)
        config.extra_dsns = [scheduler_dsn(dsn) for dsn in config.extra_dsns]
        self.config = config
        self.slots = Slots(config.concurrency)
        self.clusters: list[Cluster] = make_clusters(config, self.slots)
        self.started_at = time.monotonic()
        self.stopping = asyncio.Event()
        self.last_error: dict[str, Any] | None = None
        self._reload_task: asyncio.Task[None] | None = None
        self.reloader: Callable[[], Coroutine[Any, Any, None]] | None = None  # SIGHUP (server/reload.py)
        self.latencies = Latencies()  # /metrics' histograms
        self.tracing = tracing if tracing is not None else observe.load_tracing()
        self.events = EventPoster(config.notify_url) if config.notify_url else None
        for cluster in self.clusters:
            cluster.observer_for = self._observer
            cluster.events = self.events

    @property
    def owners(self) -> dict[str, tuple[DatabaseOwner, asyncio.Task[None]]]:
        """Every database served, by name (with several targets: host:port/name)."""
        if len(self.clusters) == 1:
            return self.clusters[0].owners
        return {cluster.database_key(name): entry for cluster in self.clusters
                for name, entry in cluster.owners.items()}

    @property
    def reachable(self) -> bool | None:
        """Some target answered its last look (None before any look)."""
        states = [cluster.reachable for cluster in self.clusters]
        return True if any(states) else (None if all(s is None for s in states) else False)

    @reachable.setter
    def reachable(self, value: bool | None) -> None:
        for cluster in self.clusters:
            cluster.reachable = value

    def _observer(self, database: str) -> observe.Observer:
        return observe.Observer(database, self.latencies, self.tracing)

    def is_healthy(self) -> tuple[bool, str]:
        """/healthz: serving (PostgreSQL reachable and, for one database, that database served); with
        several targets, while at least one is (server/clusters.py)."""
        if self.stopping.is_set():
            return False, "stopping"
        return cluster_health(self.clusters)

    # -- lifecycle -------------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve until stop(): each target rediscovers its databases in its own task, with its own backoff
        while it cannot be reached; then every owner stops at once. With --notify-url, one more task posts the
        events (server/events.py)."""
        posting = asyncio.create_task(self.events.run(), name="events") if self.events is not None else None
        try:
            await asyncio.gather(*(asyncio.create_task(cluster.run(self.stopping), name=f"cluster:{cluster.label}")
                                   for cluster in self.clusters))
            await self.shutdown()
        finally:
            if posting is not None and self.events is not None:
                posting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await posting
                await self.events.close()

    def stop(self) -> None:
        self.stopping.set()

    async def shutdown(self) -> None:
        """Stop claiming everywhere, let running attempts finish within the grace, release, close."""
        owners = list(self.owners.values())
        for owner, _ in owners:
            owner.stop()
        tasks = [task for _, task in owners]
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
        if self.events is not None:  # serve --notify-url
            total.update({key: self.events.counters[key] for key in EVENT_COUNTER_KEYS})
        return total

    def status(self) -> dict[str, Any]:
        """The /status document: a bounded, fixed set of keys whatever the number of jobs and errors.

        Anyone who can reach the port reads it, without logging in to PostgreSQL: it carries categories
        and counts only, never an error text, a job or document name, or an argument (those stay in the
        history, where PostgreSQL's row visibility decides who reads them)."""
        databases = []
        last_error = None
        served = [(cluster.label, *entry) for cluster in self.clusters for entry in sorted(cluster.owners.items())]
        for label, name, (owner, _) in served:
            databases.append({"name": name, "connected": owner.connected, "running_attempts": owner.running,
                              "reconnects": owner.reconnects, "owner_errors": owner.owner_errors,
                              "cluster": label})
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
            "clusters": [cluster.status() for cluster in self.clusters],
        }
