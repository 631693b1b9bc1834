"""``radixjobs serve`` (the daemon, its HTTP status and console) and ``radixjobs status``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import click
import psycopg

from radixjobs import output
from radixjobs.cli.common import (
    Options,
    check_reserved_slots,
    command_name,
    common_options,
    database,
    emit,
    ensure_schema,
    many_dsns_options,
    max_per_principal_option,
    reserve_options,
    tick_batch_option,
)
from radixjobs.config import Target, open_target, resolve_dsn
from radixjobs.config_file import ConfigFileCommand, bad_value, config_option, config_warning
from radixjobs.db import connect
from radixjobs.errors import ConnectError

if TYPE_CHECKING:
    import asyncio
    import socket
    from collections.abc import Callable

    from radixjobs.server.hosts import AllowedHosts


@click.command("serve", cls=ConfigFileCommand)
@config_option
@click.option("--http", "http", default="127.0.0.1:7317", show_default=True, metavar="HOST:PORT|off",
              help="Status endpoint address (port 0 picks a free port).")
@click.option("--http-max-connections", type=click.IntRange(1, 100_000), default=None, metavar="N",
              help="Most HTTP connections open at once; more are closed on accept. [default: from the "
                   "descriptor limit less what the scheduler needs, at most 64]")
@click.option("--http-request-timeout", type=click.FloatRange(0.1, 3600), default=10.0, show_default=True,
              metavar="SECONDS", help="Time an HTTP client gets to send a complete request (idle and slow "
                                      "clients are disconnected after it).")
@click.option("--http-allowed-hosts", "http_allowed_hosts", envvar="RADIXJOBS_HTTP_ALLOWED_HOSTS", multiple=True,
              metavar="HOST[,HOST…]",
              help="Host names and IP addresses the HTTP endpoint answers to (repeat, or separate with commas); "
                   "a request naming another Host gets 421 (DNS rebinding). Env RADIXJOBS_HTTP_ALLOWED_HOSTS. "
                   "[default: the --http address and localhost; bound to 0.0.0.0 or ::, any IP address and "
                   "localhost]")
@click.option("--http-auth", type=click.Choice(["token", "postgres"]), default="token", show_default=True,
              help="Console login: a token, or a PostgreSQL role and password (docs/console.md).")
@click.option("--http-token", envvar="RADIXJOBS_HTTP_TOKEN", default=None, metavar="TOKEN",
              help="The console's token (env RADIXJOBS_HTTP_TOKEN) [default: a random one, printed at start].")
@click.option("--all-databases", is_flag=True, help="Serve every ready database of the cluster.")
@click.option("--node-id", default=None, help="This node's id (default host:pid).")
@click.option("--concurrency", default=32, show_default=True, type=click.IntRange(1, 1024),
              help="Attempts running at once on this node.")
@click.option("--per-database-concurrency", default=16, show_default=True, type=click.IntRange(1, 1024),
              help="Attempts running at once per database.")
@click.option("--per-cluster-concurrency", default=None, type=click.IntRange(1, 1024), metavar="N",
              help="Attempts running at once per --dsn target (cluster). [default: --concurrency split evenly "
                   "among the targets]")
@max_per_principal_option("half of --per-database-concurrency")
@reserve_options("each database (--per-database-concurrency)")
@tick_batch_option
@click.option("--grace", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds running attempts get to finish on shutdown before they are cancelled.")
@click.option("--poll", default=1.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Longest sleep between looks at the database (notifications wake it earlier).")
@click.option("--discovery-interval", default=5.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between looks for databases becoming ready or going away.")
@click.option("--lease-seconds", default=300, show_default=True, type=click.IntRange(3, 86_400), metavar="N",
              help="Claim lease; renewed every N/3 s while the attempt runs, so it bounds how long a dead "
                   "node's claim blocks a job, not how long a job may run.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--event-loop", type=click.Choice(["asyncio", "uvloop"]), default="asyncio", show_default=True,
              help="asyncio's own loop, or uvloop (the uvloop extra; about a tenth less daemon CPU, "
                   "throughput within the noise: docs/hot-path.md).")
@click.option("--notify-url", default=None, envvar="RADIXJOBS_NOTIFY_URL", metavar="URL",
              help="POST each job's terminal failure (radix_events) here as JSON, with a timeout and bounded "
                   "retries, never delaying scheduling (docs/daemon.md#failure-events). Env RADIXJOBS_NOTIFY_URL.")
@click.option("--demo", is_flag=True, help="Install a demo job (demo.heartbeat, every 5 s) first.")
@click.option("--service", "services", multiple=True, metavar="NAME=module:function",
              help="Register a CSP service for CRON_TABLE documents (besides the radixjobs.services entry "
                   "points); who may use it is granted in the database (radixjobs docs grant-service).")
@many_dsns_options
def serve_command(opts: Options, http: str, http_max_connections: int | None, http_request_timeout: float,
                  http_allowed_hosts: tuple[str, ...], http_auth: str, http_token: str | None, all_databases: bool,
                  node_id: str | None, concurrency: int,
                  per_database_concurrency: int, per_cluster_concurrency: int | None, max_per_principal: int | None,
                  reserved_slots: int | None, long_attempt: float, tick_batch: int, grace: float, poll: float,
                  discovery_interval: float, lease_seconds: int, log_format: str, event_loop: str,
                  notify_url: str | None, demo: bool, services: tuple[str, ...]) -> None:
    """Run the scheduler daemon until SIGINT/SIGTERM (several clusters: repeat --dsn)."""
    import asyncio
    import signal

    from radixjobs.server import Daemon, DaemonConfig
    from radixjobs.server.logs import configure
    from radixjobs.server.reload import log_config_warning, parse_services, serve_reloader

    allowed = parse_services(services)
    _check_notify_url(notify_url)
    check_reserved_slots(reserved_slots, per_database_concurrency, "--per-database-concurrency")
    loop_factory = _loop_factory(event_loop)
    http_host, sockets, hosts = _http_endpoint(http, http_allowed_hosts)  # a busy port: before anything starts
    configure(logging.DEBUG if logging.getLogger().isEnabledFor(logging.DEBUG) else logging.INFO, log_format)
    log_config_warning(config_warning(click.get_current_context()))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a reload before the daemon runs must not end it
    from radixjobs.server.clusters import check_targets

    with open_target(opts.dsn, opts.home) as target:
        others = [Target(_resolved(dsn)) for dsn in opts.dsns[1:]]
        check_targets([target.dsn, *(other.dsn for other in others)])
        for each in (target, *others):
            _check_at_start(each, demo)
        config = DaemonConfig(dsn=target.dsn, all_databases=all_databases or target.embedded is not None,
                              concurrency=concurrency, per_database_concurrency=per_database_concurrency,
                              max_per_principal=max_per_principal, reserved_slots=reserved_slots,
                              long_attempt_s=long_attempt, grace_s=grace, poll_s=poll, discovery_s=discovery_interval,
                              services=allowed,
                              lease_s=lease_seconds, extra_dsns=[other.dsn for other in others],
                              per_cluster_concurrency=per_cluster_concurrency, tick_batch=tick_batch,
                              notify_url=notify_url)
        if node_id:
            config.node_id = node_id
        auth = _console_auth(target.dsn, http_auth, http_token)
        daemon = Daemon(config)
        daemon.reloader = serve_reloader(click.get_current_context(), daemon)
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_serve(daemon, http_host, sockets, demo, http_max_connections, http_request_timeout, auth,
                              hosts))


def _http_endpoint(http: str, entries: tuple[str, ...]) -> tuple[str, list[socket.socket], AllowedHosts | None]:
    """``--http``'s host, its listening sockets (none for ``off``) and the Host names it answers to; a usage
    error for a bad value, one line naming the address when it cannot be bound."""
    from radixjobs.server.hosts import AllowedHosts
    from radixjobs.server.http import listen, parse_http

    try:
        address = parse_http(http)
    except ValueError as exc:
        raise bad_value("http", str(exc)) from None
    try:
        hosts = AllowedHosts.of(entries) if entries else None
    except ValueError as exc:
        raise bad_value("http_allowed_hosts", str(exc)) from None
    if address is None:
        return "", [], None
    sockets = listen(*address)
    return address[0], sockets, hosts or AllowedHosts.default(address[0], [s.getsockname()[0] for s in sockets])


def _check_notify_url(url: str | None) -> None:
    """A usage error unless ``url`` is an http:// or https:// URL with a host (or None)."""
    from urllib.parse import urlsplit

    if url is None:
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad_value("notify_url", "expected an http:// or https:// URL")


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory for ``uvloop``, else None (asyncio's own loop)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        raise bad_value("event_loop", "uvloop is not installed (pip install 'radixjobs[uvloop]')") from None
    return uvloop.new_event_loop


def _resolved(dsn: str) -> str:
    resolved = resolve_dsn(dsn)
    assert resolved is not None  # a DSN given is never the embedded default
    return resolved


def _check_at_start(target: Any, demo: bool) -> None:
    """The schema is checked (embedded: installed) now; an external server that cannot be reached yet (or
    does not answer within 10 s) is waited for by the daemon (PostgreSQL down at start is not an error)."""
    try:
        conn = connect(target.dsn, connect_timeout=10)
    except ConnectError:
        if target.embedded is not None or demo:
            raise
        return  # the daemon logs it (once) and retries with backoff
    with conn:
        ensure_schema(conn, target)
        if demo:
            _install_demo(conn)


def _console_auth(dsn: str, mode: str, token: str | None) -> Any:
    from radixjobs.server.console import ConsoleAuth
    from radixjobs.server.console.auth import refuse_passwordless

    if mode == "postgres":
        if token:
            raise bad_value("http_token", "a token is for --http-auth token")
        refuse_passwordless(dsn)
        return ConsoleAuth("postgres")
    if token is not None and len(token) < 16:
        raise bad_value("http_token", "the console token must be at least 16 characters")
    return ConsoleAuth("token", token)


async def _serve(daemon: Any, http_host: str, sockets: list[socket.socket], demo: bool,
                 max_connections: int | None, request_timeout_s: float, auth: Any, hosts: AllowedHosts | None
                 ) -> None:
    from radixjobs.server.connections import raise_nofile_limit
    from radixjobs.server.http import host_port, http_limits, start_http

    daemon.install_signal_handlers()
    http_server = None
    if sockets:
        limits = http_limits(daemon, max_connections, request_timeout_s)
        http_server, http_task, port = await start_http(daemon, sockets, limits, auth, hosts)
        base = f"http://{host_port(http_host, port)}"
        logging.getLogger("radixjobs.server").info(
            "status %s/status metrics %s/metrics health %s/healthz node=%s http_max_connections=%s "
            "http_request_timeout_s=%s http_allowed_hosts=%s", base, base, base, daemon.config.node_id,
            limits.max_connections, limits.request_timeout_s, hosts.describe() if hosts else None,
            extra={"fields": {"http": base, "node": daemon.config.node_id,
                              "http_max_connections": limits.max_connections,
                              "http_allowed_hosts": hosts.describe() if hosts else None}})
        click.echo(f"radixjobs serving (node {daemon.config.node_id}); status: {base}/status, "
                   f"metrics: {base}/metrics", err=True)
        if auth is not None and auth.mode == "token" and auth.generated:  # shown once, never logged
            click.echo(f"console: {base}/login?token={auth.token}", err=True)
        else:
            how = "a PostgreSQL role" if auth is not None and auth.mode == "postgres" else "your token"
            click.echo(f"console: {base}/ (log in with {how})", err=True)
    else:
        raise_nofile_limit()
    if demo:
        me = command_name()
        click.echo(f"demo job demo.heartbeat runs every 5 s: see `{me} jobs history demo.heartbeat` "
                   f"or `{me} sql -c 'select * from demo.runs order by id desc limit 5'`", err=True)
    try:
        await daemon.run()
    finally:
        if http_server is not None:
            http_server.should_exit = True
            await http_task


def _install_demo(conn: psycopg.Connection[Any]) -> None:
    from radixjobs.migrate import read_sql
    from radixjobs.scripts import run_script

    for _ in run_script(conn, read_sql("demo.sql")):
        pass




@click.command("status")
@click.option("--http", "http", default="127.0.0.1:7317", show_default=True, metavar="HOST:PORT|URL",
              help="Where a running daemon answers (HOST:PORT, or an http:// URL of it).")
@common_options
def status_command(opts: Options, http: str) -> None:
    """Status of a running daemon, or (when none answers) of the database."""
    import json as jsonlib
    import urllib.request

    url = _status_url(http)
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (an http:// URL, checked)
            value = {"source": "daemon", **jsonlib.loads(response.read())}
    except (OSError, ValueError):
        with database(opts) as conn:
            value = {"source": "database", **_database_status(conn)}
    human = output.render_mapping({k: v for k, v in value.items() if not isinstance(v, dict | list)})
    for key in ("counters", "jobs_by_status"):
        if isinstance(value.get(key), dict):
            human += "\n" + key + ":\n" + output.render_mapping(value[key])
    if isinstance(value.get("clusters"), list) and value["clusters"]:
        human += "\nclusters:\n" + output.render_records(
            value["clusters"], ["target", "reachable", "databases", "running_attempts", "slots"])
    emit(opts, value, human)


def _status_url(value: str) -> str:
    """The /status URL of ``HOST:PORT`` or ``http://HOST:PORT[/]``; a usage error naming the problem."""
    from urllib.parse import urlsplit

    parts = urlsplit(value if "://" in value else f"http://{value}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if (parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/")
            or parts.query or parts.fragment or parts.username is not None):
        raise click.BadParameter(f"expected HOST:PORT or http://HOST:PORT, got {value!r}", param_hint="--http")
    return f"http://{parts.netloc}/status"


def _database_status(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    by_status = dict(conn.execute("SELECT status, count(*) FROM radix.job_overview GROUP BY status").fetchall())
    nodes = conn.execute("SELECT radix.live_node_count()").fetchone()  # any role (radix.nodes is not)
    last = conn.execute("SELECT error FROM radix.job_history WHERE error IS NOT NULL "
                        "ORDER BY history_id DESC LIMIT 1").fetchone()
    return {"database": conn.info.dbname, "live_nodes": nodes[0] if nodes else 0, "jobs_by_status": by_status,
            "last_error": last[0] if last else None}
