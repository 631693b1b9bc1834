"""Many clusters per daemon: one supervisor per target (``serve --dsn A --dsn B``).

Invariants:
- Each target has its own supervisor task: its discovery of ready databases, its owners (one per database,
  each with its own reconnect loop), its reachability state and its backoff. No look at one target waits on
  another: every look is bounded (``LOOK_TIMEOUT_S``) and runs in that target's task only, so a target that
  is down, unreachable or hanging delays nothing but itself, and a stop is never held up by a look.
- Slots: an attempt holds one slot of its database's engine (--per-database-concurrency), one of its cluster
  (--per-cluster-concurrency, by default an even share of --concurrency) and one of the node (--concurrency).
  With the default shares, the attempts of a cluster that hangs cannot take the slots the others need.
- A target is labelled ``host:port/dbname`` (``host1:port1,host2:port2/dbname`` for a multi-host DSN) in
  /status, /metrics, /healthz and the logs: never its user, password or other parameters. Two targets with
  the same label are refused (they would serve the same databases twice).
- Node ids stay unique in every database: with one target the node id is the one given (--node-id, default
  host:pid); with several, each target's owners register ``NODE@LABEL``, so two targets that reach the same
  database (two spellings of one host) are two nodes there, never one node id in two sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from radixjobs import migrate, routines
from radixjobs.db import first_line, scheduler_dsn
from radixjobs.engine.slots import Slots
from radixjobs.errors import ConfigError
from radixjobs.observe import Observer
from radixjobs.server.config import DaemonConfig
from radixjobs.server.events import EventPoster
from radixjobs.server.owner import DatabaseOwner

log = logging.getLogger("radixjobs.server")

LOOK_TIMEOUT_S = 15.0  # one look at a target (connect, list, probe every database) at most this long
FIRST_BACKOFF_S = 0.2
LIST_DATABASES = "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate ORDER BY datname"


def dsn_for_database(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


async def is_ready(dsn: str, *, unreachable_raises: bool = False) -> bool:
    """Is radixjobs installed there at exactly this code's schema version and routines? A server that cannot
    be reached is not ready, or (``unreachable_raises``) raises its psycopg.OperationalError."""
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
            if not (row and row[0] == migrate.code_version()):
                return False
            cur = await conn.execute(migrate.CHECKSUM_QUERY)
            row = await cur.fetchone()
    except psycopg.Error:
        return False
    return bool(row and row[0] == routines.checksum())


def target_label(dsn: str) -> str:
    """``host:port/dbname`` of a DSN (libpq's defaults and PG* variables filled in), nothing else of it."""
    params = conninfo_to_dict(dsn)
    hosts = str(params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or "localhost").split(",")
    ports = str(params.get("port") or os.environ.get("PGPORT") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    dbname = (params.get("dbname") or os.environ.get("PGDATABASE") or params.get("user")
              or os.environ.get("PGUSER") or "postgres")
    pairs = ",".join(f"{host or 'localhost'}:{port or '5432'}" for host, port in zip(hosts, ports, strict=False))
    return f"{pairs}/{dbname}"


def check_targets(dsns: Iterable[str]) -> list[str]:
    """The targets' labels; ConfigError when two are the same server and database."""
    labels: list[str] = []
    for dsn in dsns:
        label = target_label(dsn)
        if label in labels:
            raise ConfigError(f"--dsn: {label} is given twice (each target must be a different server or database)")
        labels.append(label)
    return labels


class ClusterSlots(Slots):
    """A cluster's share of the node's slots: a slot is taken here and in the node's ``Slots`` at once."""

    def __init__(self, capacity: int, node: Slots):
        super().__init__(capacity, parent=node)
        self.node = node


def cluster_share(config: DaemonConfig, targets: int) -> int:
    """Slots of one cluster: --per-cluster-concurrency, else an even share of --concurrency (at least 1)."""
    if config.per_cluster_concurrency is not None:
        return min(config.per_cluster_concurrency, config.concurrency)
    return max(1, config.concurrency // max(1, targets))


class Cluster:
    """One target of a daemon: discovery, owners and reachability of that server (and its databases)."""

    def __init__(self, config: DaemonConfig, dsn: str, *, label: str, node_id: str, slots: ClusterSlots,
                 qualify: bool):
        self.config = config
        self.dsn = dsn
        self.label = label
        self.node_id = node_id
        self.slots = slots
        self.qualify = qualify  # several targets: databases are named LABEL-of-the-database in owners views
        self.owners: dict[str, tuple[DatabaseOwner, asyncio.Task[None]]] = {}
        self.reachable: bool | None = None  # None until the first look
        self.looks = 0
        self.observer_for: Callable[[str], Observer] | None = None  # a database's telemetry (radixjobs.observe)
        self.events: EventPoster | None = None  # serve --notify-url (server/events.py), shared by every owner

    def database_key(self, name: str) -> str:
        """The database's name in the daemon's views: its name, or with several targets host:port/name."""
        return f"{self.label.rsplit('/', 1)[0]}/{name}" if self.qualify else name

    # -- discovery -------------------------------------------------------------------------------
    async def ready_databases(self) -> list[str]:
        """The databases to serve: the DSN's own, or every ready one of the cluster."""
        if not self.config.all_databases:
            name = conninfo_to_dict(self.dsn).get("dbname") or self.label.rsplit("/", 1)[1]
            return [str(name)] if await is_ready(self.dsn, unreachable_raises=True) else []
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            cur = await conn.execute(LIST_DATABASES)
            names = [row[0] for row in await cur.fetchall()]
        checks = await asyncio.gather(*(is_ready(dsn_for_database(self.dsn, n)) for n in names))
        return [name for name, ready in zip(names, checks, strict=True) if ready]

    async def look(self, stopping: asyncio.Event) -> set[str] | None:
        """The ready databases, or None when the target cannot be reached, does not answer within
        LOOK_TIMEOUT_S, or ``stopping`` is set meanwhile (the look is abandoned then)."""
        self.looks += 1
        look = asyncio.create_task(asyncio.wait_for(self.ready_databases(), LOOK_TIMEOUT_S))
        stop = asyncio.create_task(stopping.wait())
        try:
            await asyncio.wait({look, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not look.done():
            look.cancel()
            with contextlib.suppress(BaseException):
                await look
            return None
        try:
            ready = set(look.result())
        except TimeoutError:
            self._reachability(False, f"no answer within {LOOK_TIMEOUT_S:g}s")
            return None
        except (psycopg.Error, OSError) as exc:
            self._reachability(False, first_line(exc))
            return None
        self._reachability(True)
        return ready

    async def apply(self, ready: set[str]) -> None:
        """Start owners for new ready databases; stop those of databases that are gone or not ready."""
        for name in sorted(ready - self.owners.keys()):
            self._start_owner(name)
        for name in sorted(self.owners.keys() - ready):
            owner, task = self.owners.pop(name)
            log.info("database no longer ready db=%s node=%s cluster=%s", name, self.node_id, self.label)
            owner.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, self.config.grace_s + 10)

    def _start_owner(self, name: str) -> None:
        dsn = dsn_for_database(self.dsn, name) if self.config.all_databases else self.dsn
        owner = DatabaseOwner(name, dsn, node_id=self.node_id, slots=self.slots,
                              concurrency=self.config.per_database_concurrency, poll_s=self.config.poll_s,
                              grace_s=self.config.grace_s, services=self.config.services,
                              max_per_principal=self.config.max_per_principal, lease_s=self.config.lease_s,
                              tick_batch=self.config.tick_batch, reserved_slots=self.config.reserved_slots,
                              long_attempt_s=self.config.long_attempt_s)
        if self.observer_for is not None:
            owner.observer = self.observer_for(name)
        owner.events = self.events
        self.owners[name] = (owner, asyncio.create_task(owner.run(), name=f"owner:{self.label}:{name}"))
        log.info("serving database db=%s node=%s cluster=%s", name, self.node_id, self.label)

    def _reachability(self, reachable: bool, error: str = "") -> None:
        """Log once per state change: PostgreSQL became unreachable, or reachable again."""
        before, self.reachable = self.reachable, reachable
        fields = {"node": self.node_id, "cluster": self.label}
        if reachable and before is False:
            for owner, _ in self.owners.values():  # reconnect now, not when the backoff ends (a failover)
                owner.reachable.set()
            log.info("PostgreSQL is reachable again node=%s cluster=%s", self.node_id, self.label,
                     extra={"fields": {"event": "postgres_reachable", **fields}})
        elif not reachable and before is not False:
            log.warning("PostgreSQL is not reachable node=%s cluster=%s error=%s; retrying with backoff (up to "
                        "every %gs)", self.node_id, self.label, error, self.config.discovery_s,
                        extra={"fields": {"event": "postgres_unreachable", **fields}})

    def health(self) -> tuple[bool, str]:
        if not self.reachable:
            return False, "not ready: PostgreSQL is not reachable"
        if not self.config.all_databases and not self.owners:
            return False, "not ready: the database is not ready (radixjobs install)"
        return True, "ok"

    # -- lifecycle -------------------------------------------------------------------------------
    async def run(self, stopping: asyncio.Event) -> None:
        """Look again every --discovery-interval until ``stopping``; while the target cannot be reached,
        with jittered exponential backoff (0.2 s up to --discovery-interval). Owners are left running:
        the daemon stops them all at once (one grace for every cluster)."""
        backoff = FIRST_BACKOFF_S
        while not stopping.is_set():
            try:
                ready = await self.look(stopping)
                if ready is not None and not stopping.is_set():
                    await self.apply(ready)
            except Exception as exc:  # a bug must not end this target's supervision (nor the others')
                self.reachable = False
                log.error("cluster supervisor failed cluster=%s error=%s: %s", self.label, type(exc).__name__,
                          first_line(exc), exc_info=exc)
            if self.reachable:
                backoff, wait_s = FIRST_BACKOFF_S, self.config.discovery_s
            else:
                wait_s = min(backoff, self.config.discovery_s) * (0.5 + random.random() / 2)
                backoff = min(backoff * 2, self.config.discovery_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), wait_s)

    # -- status ----------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        return sum(owner.running for owner, _ in self.owners.values())

    def counters(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for owner, _ in self.owners.values():
            for key, value in owner.counters().items():
                total[key] = total.get(key, 0) + value
        return total

    def status(self) -> dict[str, Any]:
        """This target in /status: its label and state, counts only."""
        return {"target": self.label, "reachable": self.reachable, "databases": len(self.owners),
                "running_attempts": self.running, "slots": self.slots.capacity, "node": self.node_id}


def make_clusters(config: DaemonConfig, node_slots: Slots) -> list[Cluster]:
    """The daemon's targets, labelled, each with its share of the node's slots and its node id."""
    targets = [config.dsn, *config.extra_dsns]
    labels = check_targets(targets)
    share = cluster_share(config, len(targets))
    several = len(targets) > 1
    return [Cluster(config, dsn, label=label, node_id=f"{config.node_id}@{label}" if several else config.node_id,
                    slots=ClusterSlots(share, node_slots), qualify=several)
            for dsn, label in zip(targets, labels, strict=True)]


def cluster_health(clusters: Sequence[Cluster]) -> tuple[bool, str]:
    """/healthz of several targets: ready while at least one serves (degraded, naming the others)."""
    states = [(cluster, *cluster.health()) for cluster in clusters]
    if len(states) == 1:
        return states[0][1], states[0][2]
    down = [f"{cluster.label} ({text.removeprefix('not ready: ')})" for cluster, ok, text in states if not ok]
    if len(down) == len(states):
        return False, "not ready: no cluster is served: " + "; ".join(down)
    if down:
        return True, f"degraded: {len(down)} of {len(states)} clusters not ready: " + "; ".join(down)
    return True, "ok"


def cluster_metrics(clusters: Sequence[Cluster]) -> Iterable[Metric]:
    """Per-target series for /metrics, labelled by the target (bounded: one set per --dsn)."""
    gauges = {"reachable": "1 when the cluster answered the last look", "databases": "Databases served",
              "running_attempts": "Attempts running now", "slots": "Attempt slots of the cluster"}
    counters = {"claims": "Ticks claimed", "successes": "Attempts that succeeded",
                "failures": "Attempts that failed (any category)"}
    families = {key: GaugeMetricFamily(f"radixjobs_cluster_{key}", text, labels=["cluster"])
                for key, text in gauges.items()}
    totals = {key: CounterMetricFamily(f"radixjobs_cluster_{key}", text, labels=["cluster"])
              for key, text in counters.items()}
    for cluster in clusters:
        values = cluster.counters()
        families["reachable"].add_metric([cluster.label], 1 if cluster.reachable else 0)
        families["databases"].add_metric([cluster.label], len(cluster.owners))
        families["running_attempts"].add_metric([cluster.label], cluster.running)
        families["slots"].add_metric([cluster.label], cluster.slots.capacity)
        totals["claims"].add_metric([cluster.label], values.get("claims", 0))
        totals["successes"].add_metric([cluster.label], values.get("successes", 0))
        totals["failures"].add_metric([cluster.label], sum(v for k, v in values.items() if k.startswith("failures_")))
    yield from families.values()
    yield from totals.values()
