"""HTTP of a daemon: /status (JSON), /metrics (Prometheus text), /healthz, and the console at / (console/)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Iterable

import uvicorn
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from radixjobs.documents.runner import COUNTER_KEYS as DOCUMENT_COUNTER_KEYS
from radixjobs.errors import ConfigError
from radixjobs.latency import Histogram
from radixjobs.output import jsonable
from radixjobs.retry import Category
from radixjobs.server.clusters import cluster_metrics
from radixjobs.server.connections import (
    DEFAULT_REQUEST_TIMEOUT_S,
    MAX_HEADER_BYTES,
    HttpLimits,
    default_max_connections,
    protocol_class,
    raise_nofile_limit,
    scheduler_reserve,
)
from radixjobs.server.console import ConsoleAuth, SecurityHeaders
from radixjobs.server.console.app import Console
from radixjobs.server.daemon import Daemon
from radixjobs.server.events import COUNTER_KEYS as EVENT_COUNTER_KEYS
from radixjobs.server.hosts import AllowedHosts, HostCheck

log = logging.getLogger("radixjobs.server")

DEFAULT_HTTP = "127.0.0.1:7317"
# asyncio accepts up to the backlog at once, and closes a refused connection's socket on its next loop
# iteration: a burst briefly holds about two backlogs of descriptors beyond the cap
BACKLOG = 64
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DaemonCollector(Collector):
    """Reads the daemon's counters at scrape time. Labels are bounded: failure category, and the cluster
    (one per --dsn target)."""

    def __init__(self, daemon: Daemon):
        self.daemon = daemon

    def collect(self) -> Iterable[Metric]:
        counters = self.daemon.counters()
        simple = {
            "claims": "Ticks claimed", "batched_ticks": "Ticks run in a batch of ticks",
            "successes": "Attempts that succeeded", "retries": "Attempts retried",
            "coalesced_ticks": "Missed interval ticks coalesced",
            "ticks_refused": "Ticks found here that another session ran, that changed, or that came early",
            "lease_recoveries": "Expired or orphaned "
            "claims resumed", "leases_lost": "Attempts whose lease was lost", "terminations": "Backends "
            "terminated past their deadline",
        }
        for key, help_text in simple.items():
            metric = CounterMetricFamily(f"radixjobs_{key}", help_text)
            metric.add_metric([], counters.get(key, 0))
            yield metric
        for key in DOCUMENT_COUNTER_KEYS:
            metric = CounterMetricFamily(f"radixjobs_{key}", f"CRON_TABLE documents: {key[4:]}")
            metric.add_metric([], counters.get(key, 0))
            yield metric
        for key in EVENT_COUNTER_KEYS:  # serve --notify-url (0 without it)
            metric = CounterMetricFamily(f"radixjobs_{key}", f"radix_events for --notify-url: {key[7:]}")
            metric.add_metric([], counters.get(key, 0))
            yield metric
        failures = CounterMetricFamily("radixjobs_failures", "Failed attempts by cause category",
                                       labels=["category"])
        for category in Category:
            failures.add_metric([str(category)], counters.get(f"failures_{category}", 0))
        yield failures
        status = self.daemon.status()
        running = GaugeMetricFamily("radixjobs_running_attempts", "Attempts running now")
        running.add_metric([], status["running_attempts"])
        yield running
        databases = GaugeMetricFamily("radixjobs_databases", "Databases served by this node")
        databases.add_metric([], len(status["databases"]))
        yield databases
        uptime = GaugeMetricFamily("radixjobs_uptime_seconds", "Seconds since the daemon started")
        uptime.add_metric([], status["uptime_s"])
        yield uptime
        yield from cluster_metrics(self.daemon.clusters)
        yield from self.histograms()

    def histograms(self) -> Iterable[Metric]:
        """Latencies (radixjobs.latency; the same as the OpenTelemetry metrics when those are on)."""
        latencies = self.daemon.latencies
        claims = HistogramMetricFamily("radixjobs_claim_duration_seconds", "Duration of a claim round trip")
        claims.add_metric([], _buckets(latencies.claims), latencies.claims.sum)
        yield claims
        attempts = HistogramMetricFamily("radixjobs_attempt_duration_seconds", "Duration of an attempt, start "
                                         "to finalisation, by outcome", labels=["outcome"])
        for outcome, histogram in latencies.attempts.items():
            attempts.add_metric([outcome], _buckets(histogram), histogram.sum)
        yield attempts


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    return [("+Inf" if bound == float("inf") else repr(bound), count) for bound, count in histogram.cumulative()]


def make_app(daemon: Daemon, auth: ConsoleAuth | None = None, allowed_hosts: AllowedHosts | None = None
             ) -> Starlette:
    """The endpoints and the console (``auth``: its access; default a token mode with a random token),
    answering requests whose Host is ``allowed_hosts`` (default: the default address's)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(DaemonCollector(daemon))

    async def status(_: Request) -> Response:
        return JSONResponse(jsonable(daemon.status()))

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=PROMETHEUS_CONTENT_TYPE)

    async def healthz(_: Request) -> Response:
        healthy, text = daemon.is_healthy()
        return PlainTextResponse(text, status_code=200 if healthy else 503)

    console = Console(daemon, auth or ConsoleAuth())
    return Starlette(routes=[Route("/status", status), Route("/metrics", metrics), Route("/healthz", healthz),
                             *console.routes()],
                     exception_handlers={404: console.not_found},
                     middleware=[Middleware(SecurityHeaders), Middleware(
                         HostCheck, allowed=allowed_hosts or AllowedHosts.default(DEFAULT_HTTP.rpartition(":")[0]))])


def parse_http(value: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (port 0 picks a free one) or ``off``; raises ValueError naming the problem."""
    if value.lower() == "off":
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT or off, got {value!r}")
    return host.strip("[]"), int(port)


def http_limits(daemon: Daemon, max_connections: int | None = None,
                request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> HttpLimits:
    """The status endpoint's bounds: by default a connection cap computed from the descriptor limit
    (raised to the hard limit first) less what the scheduler's own connections need."""
    soft = raise_nofile_limit()
    reserve = scheduler_reserve(daemon.config.concurrency)
    cap = max_connections if max_connections is not None else default_max_connections(soft, reserve)
    return HttpLimits(max_connections=cap, request_timeout_s=request_timeout_s, reserve=reserve, soft_limit=soft)


def listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to (port 0: the first one's free port for all);
    raises ConfigError in one line naming the address when one cannot be bound (in use, not local, …)."""
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host_port(host, port)} (--http): {exc.strerror or exc}") from None
    sockets: list[socket.socket] = []
    try:
        for family, _, _, _, address in dict.fromkeys(found):
            bind = (str(address[0]), port or (sockets[0].getsockname()[1] if sockets else 0))
            sockets.append(socket.create_server(bind, family=family, backlog=BACKLOG))
    except OSError as exc:
        for sock in sockets:
            sock.close()
        reason = "the address is already in use (another radixjobs serve?)" if exc.errno == errno.EADDRINUSE \
            else (os.strerror(exc.errno) if exc.errno else str(exc)).lower()
        raise ConfigError(f"cannot listen on {host_port(host, port)} (--http): {reason}") from None
    return sockets


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_http(daemon: Daemon, sockets: list[socket.socket], limits: HttpLimits | None = None,
                     auth: ConsoleAuth | None = None, allowed_hosts: AllowedHosts | None = None,
                     ) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    """Serve the status endpoints on ``sockets`` (listen()) in this event loop; returns the server, its task
    and the bound port."""
    limits = limits or http_limits(daemon)
    keep_alive = max(1, min(5, int(limits.request_timeout_s)))
    config = uvicorn.Config(SecurityHeaders(make_app(daemon, auth, allowed_hosts)),  # outermost: on a 500 too
                            log_level="warning", lifespan="off",
                            access_log=False, http=protocol_class(limits), ws="none",
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES, timeout_keep_alive=keep_alive,
                            backlog=min(limits.max_connections, BACKLOG), server_header=False)
    server = uvicorn.Server(config)
    # the daemon owns SIGINT/SIGTERM (clean shutdown of attempts first); uvicorn must not take them
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve(sockets=sockets))
    while not server.started:
        if task.done():
            task.result()
            raise OSError("the HTTP server stopped while starting")
        await asyncio.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return server, task, int(bound)
