"""The ``radixjobs`` command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
import psycopg

from radixjobs import migrate, output
from radixjobs.cli_check import check_command
from radixjobs.cli_common import (
    Options,
    common_options,
    database,
    decode_utf8,
    emit,
    ensure_schema,
    input_name,
    max_per_principal_option,
)
from radixjobs.cli_docs import docs_group
from radixjobs.config import open_target
from radixjobs.config_file import ConfigFileCommand, config_option
from radixjobs.db import connect, first_line
from radixjobs.embedded import EmbeddedServer
from radixjobs.errors import ConnectError, RadixError
from radixjobs.model import HISTORY_STATUSES


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--dsn", envvar="RADIXJOBS_DSN", default=None, metavar="DSN", help="PostgreSQL DSN or URI.")
@click.option("--home", envvar="RADIXJOBS_HOME", default=None, metavar="DIR",
              type=click.Path(file_okay=False, path_type=Path), help="Embedded server data directory.")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print JSON.")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.version_option(package_name="radixjobs")
@click.pass_context
def cli(ctx: click.Context, dsn: str | None, home: Path | None, as_json: bool, verbose: int) -> None:
    """radixjobs: a durable, SQL-native job scheduler for PostgreSQL."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    ctx.obj = Options(dsn, home, as_json)


# -- sql ---------------------------------------------------------------------------------------------
@cli.command("sql")
@click.option("-c", "--command", "texts", multiple=True, metavar="TEXT",
              help="SQL text to run (repeatable: run in order, as psql does).")
@click.option("-f", "--file", "file", default=None, type=click.File("rb"),
              help="SQL script to run ('-' for standard input).")
@common_options
def sql_command(opts: Options, texts: tuple[str, ...], file: Any) -> None:
    """Run SQL (and job DDL) from -c TEXT (repeatable), -f FILE or standard input, statement by statement."""
    from radixjobs.scripts import run_script

    if texts and file is not None:
        raise click.UsageError("give either -c or -f, not both")
    if not texts:
        stream = file if file is not None else sys.stdin.buffer
        texts = (decode_utf8(stream.read(), input_name(file)),)
    with database(opts, pinned=False) as conn:  # the user's SQL, in the user's own search_path
        for result in (result for text in texts for result in run_script(conn, text)):
            if opts.json:
                if result.returns_rows:
                    click.echo(output.to_json(result.records()))
            elif result.returns_rows:
                click.echo(output.render_table(result.columns, result.rows))
            elif result.status:
                click.echo(result.status)


# -- install -----------------------------------------------------------------------------------------
@cli.command("install")
@common_options
def install_command(opts: Options) -> None:
    """Create or upgrade the radix schema (idempotent)."""
    with database(opts, need_schema=False) as conn:
        applied = migrate.install(conn)
        version = migrate.code_version()
        names = [f"{m.version:04d}_{m.name}" for m in applied]
        human = (f"applied {len(applied)} migration(s): {', '.join(names)}; schema at version {version}"
                 if applied else f"schema already at version {version}; nothing to do")
        emit(opts, {"database": conn.info.dbname, "version": version, "applied": names}, human)


# -- db ----------------------------------------------------------------------------------------------
@cli.group("db")
def db_group() -> None:
    """Manage the embedded PostgreSQL server."""


def _server(opts: Options) -> EmbeddedServer:
    return EmbeddedServer(opts.home)


@db_group.command("start")
@common_options
def db_start(opts: Options) -> None:
    """Start the embedded server (kept running until `db stop`) and install the schema."""
    server = _server(opts)
    info, started = server.ensure_running(persistent=True)
    try:
        with connect(info.dsn()) as conn:
            migrate.install(conn)
    finally:
        server.release()
    state = "started" if started else "already running"
    emit(opts, {"state": state, "pid": info.pid, "uri": info.dsn(), "home": str(server.home)},
         f"embedded PostgreSQL {state} (pid {info.pid}); schema at version {migrate.code_version()}\n"
         f"uri: {info.dsn()}")


@db_group.command("stop")
@common_options
def db_stop(opts: Options) -> None:
    """Stop the embedded server."""
    stopped = _server(opts).stop()
    emit(opts, {"stopped": stopped}, "stopped" if stopped else "not running")


@db_group.command("status")
@common_options
def db_status(opts: Options) -> None:
    """Show whether the embedded server runs (exit code 3 when it does not)."""
    server = _server(opts)
    info = server.info()
    value = {"running": info is not None, "home": str(server.home), "pid": info.pid if info else None,
             "uri": info.dsn() if info else None}
    emit(opts, value, f"running (pid {info.pid}) uri: {info.dsn()}" if info
         else f"not running (home {server.home})")
    if info is None:
        sys.exit(3)


@db_group.command("uri")
@click.option("--database", "dbname", default="postgres", show_default=True)
@common_options
def db_uri(opts: Options, dbname: str) -> None:
    """Print a libpq URI of the running embedded server (psql accepts it)."""
    info = _server(opts).info()
    if info is None:
        raise RadixError("the embedded server is not running: start it with `radixjobs db start`")
    emit(opts, {"uri": info.dsn(dbname)}, info.dsn(dbname))


def main() -> None:
    """Entry point: user errors are one line on stderr and a non-zero exit code, never a traceback."""
    try:
        code = cli.main(standalone_mode=False, prog_name="radixjobs")
        if isinstance(code, int) and code:
            sys.exit(code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("radixjobs: aborted", err=True)
        sys.exit(130)
    except RadixError as exc:
        click.echo(f"radixjobs: error: {exc}", err=True)
        sys.exit(1)
    except psycopg.Error as exc:
        state = f" [{exc.sqlstate}]" if exc.sqlstate else ""
        click.echo(f"radixjobs: error{state}: {first_line(exc)}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


# -- jobs --------------------------------------------------------------------------------------------
@cli.group("jobs")
def jobs_group() -> None:
    """List and inspect jobs."""


@jobs_group.command("list")
@common_options
def jobs_list(opts: Options) -> None:
    """Jobs (and CRON_TABLE documents, as doc:NUM) with schedule, principal, procedure, state, next run."""
    from radixjobs import catalog, documents

    with database(opts) as conn:
        jobs = catalog.list_jobs(conn) + documents.overview(conn)
    emit(opts, jobs, output.render_records(jobs, catalog.LIST_COLUMNS))


@jobs_group.command("show")
@click.argument("name")
@common_options
def jobs_show(opts: Options, name: str) -> None:
    """One job in full (NAME is schema.name)."""
    from radixjobs import catalog

    with database(opts) as conn:
        job = catalog.get_job(conn, name)
    if job is None:
        raise RadixError(f"job {name} does not exist (or is not visible to this role)")
    human = dict(job)
    human["arguments"] = catalog.describe_arguments(job["arguments"])
    human["timeout"] = catalog.describe_timeout(job["deadline_ms"])
    emit(opts, job, output.render_mapping(human))


HISTORY_COLUMNS = ("status", "planned_at", "started_at", "duration", "attempt", "category", "message")


@jobs_group.command("history")
@click.argument("name")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000),
              help="Show at most N attempts (the newest).")
@click.option("--status", "statuses", multiple=True, type=click.Choice(HISTORY_STATUSES),
              help="Only attempts with this status (repeat for several).")
@click.option("--since", default=None, metavar="WHEN",
              help="Only attempts started at or after WHEN: an ISO timestamp (UTC unless it has an offset) "
                   "or an interval before now, like '1 hour'.")
@common_options
def jobs_history(opts: Options, name: str, limit: int, statuses: tuple[str, ...], since: str | None) -> None:
    """The newest attempts of a job: status, planned and start time, duration, attempt, error category and
    message (--json: the full records)."""
    from radixjobs import catalog

    with database(opts) as conn:
        try:
            start = catalog.resolve_since(conn, since) if since is not None else None
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
        if catalog.get_job(conn, name) is None:
            raise RadixError(f"job {name} does not exist (or is not visible to this role)")
        rows = catalog.job_history(conn, name, limit, statuses=statuses, since=start)
    emit(opts, rows, output.render_table(HISTORY_COLUMNS, [_history_row(r) for r in rows]))


def _history_row(row: dict[str, Any]) -> list[Any]:
    raw = row.get("error")
    error: dict[str, Any] = raw if isinstance(raw, dict) else {}
    message = error.get("message") or error.get("kind") or ""
    return [row["status"], output.timestamp(row["planned_at"]), output.timestamp(row["started_at"]),
            output.duration(row["duration"]), row["attempt"], error.get("category") or "",
            output.one_line(message)]


# -- run ---------------------------------------------------------------------------------------------
@cli.command("run")
@click.option("--once", "once", is_flag=True, help="Run what is due now, then exit.")
@click.option("--for", "seconds", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Run due work as it comes due for SECONDS, then exit.")
@click.option("--node-id", default=None, help="This node's id (default host:pid).")
@click.option("--concurrency", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Attempts run at the same time.")
@max_per_principal_option("half of --concurrency")
@click.option("--lease-seconds", default=300, show_default=True, type=click.IntRange(3, 86_400), metavar="N",
              help="Claim lease; renewed every N/3 s while the attempt runs, so it bounds how long a dead "
                   "node's claim blocks a job, not how long a job may run.")
@common_options
def run_command(opts: Options, once: bool, seconds: float | None, node_id: str | None, concurrency: int,
                max_per_principal: int | None, lease_seconds: int) -> None:
    """Run due jobs of one database in the foreground (the daemon is `serve`)."""
    import asyncio

    from radixjobs.engine import Engine

    if once == (seconds is not None):
        raise click.UsageError("give exactly one of --once or --for SECONDS")

    async def go(dsn: str) -> dict[str, Any]:
        async with Engine(dsn, node_id=node_id, concurrency=concurrency,
                          max_per_principal=max_per_principal, lease_s=lease_seconds) as engine:
            ran = await engine.run_due() if once else await engine.run_for(seconds or 0.0)
            return {"attempts": ran, "node": engine.node_id, "counters": dict(engine.counters),
                    "last_error": engine.last_error}

    with open_target(opts.dsn, opts.home) as target:
        with connect(target.dsn) as conn:
            ensure_schema(conn, target)
        result = asyncio.run(go(target.dsn))
    counters = ", ".join(f"{k}={v}" for k, v in sorted(result["counters"].items())) or "none"
    emit(opts, result, f"ran {result['attempts']} attempt(s) on node {result['node']}; counters: {counters}")


# -- serve / status ------------------------------------------------------------------------------------
@cli.command("serve", cls=ConfigFileCommand)
@config_option
@click.option("--http", "http", default="127.0.0.1:7317", show_default=True, metavar="HOST:PORT|off",
              help="Status endpoint address (port 0 picks a free port).")
@click.option("--http-max-connections", type=click.IntRange(1, 100_000), default=None, metavar="N",
              help="Most HTTP connections open at once; more are closed on accept. [default: from the "
                   "descriptor limit less what the scheduler needs, at most 64]")
@click.option("--http-request-timeout", type=click.FloatRange(0.1, 3600), default=10.0, show_default=True,
              metavar="SECONDS", help="Time an HTTP client gets to send a complete request (idle and slow "
                                      "clients are disconnected after it).")
@click.option("--http-auth", type=click.Choice(["token", "postgres"]), default="token", show_default=True,
              help="Console login: a token, or a PostgreSQL role and password (docs/console.md).")
@click.option("--http-token", envvar="RADIXJOBS_HTTP_TOKEN", default=None, metavar="TOKEN",
              help="The console's token (env RADIXJOBS_HTTP_TOKEN) [default: a random one, printed at start].")
@click.option("--all-databases", is_flag=True, help="Serve every ready database of the cluster.")
@click.option("--node-id", default=None, help="This node's id (default host:pid).")
@click.option("--concurrency", default=32, show_default=True, type=click.IntRange(1, 1024),
              help="Attempts running at once on this node.")
@click.option("--per-database-concurrency", default=8, show_default=True, type=click.IntRange(1, 1024),
              help="Attempts running at once per database.")
@max_per_principal_option("half of --per-database-concurrency")
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
@click.option("--demo", is_flag=True, help="Install a demo job (demo.heartbeat, every 5 s) first.")
@click.option("--service", "services", multiple=True, metavar="NAME=module:function",
              help="Register a CSP service for CRON_TABLE documents (besides the radixjobs.services entry "
                   "points); who may use it is granted in the database (radixjobs docs grant-service).")
@common_options
def serve_command(opts: Options, http: str, http_max_connections: int | None, http_request_timeout: float,
                  http_auth: str, http_token: str | None, all_databases: bool, node_id: str | None, concurrency: int,
                  per_database_concurrency: int, max_per_principal: int | None, grace: float, poll: float,
                  discovery_interval: float, lease_seconds: int, log_format: str, demo: bool,
                  services: tuple[str, ...]) -> None:
    """Run the scheduler daemon until SIGINT/SIGTERM."""
    import asyncio
    import signal

    from radixjobs.server import Daemon, DaemonConfig
    from radixjobs.server.http import parse_http
    from radixjobs.server.logs import configure
    from radixjobs.server.reload import parse_services, serve_reloader

    try:
        address = parse_http(http)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--http") from None
    allowed = parse_services(services)
    configure(logging.INFO, log_format)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a reload before the daemon runs must not end it
    with open_target(opts.dsn, opts.home) as target:
        _check_at_start(target, demo)
        config = DaemonConfig(dsn=target.dsn, all_databases=all_databases or target.embedded is not None,
                              concurrency=concurrency, per_database_concurrency=per_database_concurrency,
                              max_per_principal=max_per_principal,
                              grace_s=grace, poll_s=poll, discovery_s=discovery_interval, services=allowed,
                              lease_s=lease_seconds)
        if node_id:
            config.node_id = node_id
        auth = _console_auth(target.dsn, http_auth, http_token)
        daemon = Daemon(config)
        daemon.reloader = serve_reloader(click.get_current_context(), daemon)
        asyncio.run(_serve(daemon, address, demo, http_max_connections, http_request_timeout, auth))


def _check_at_start(target: Any, demo: bool) -> None:
    """The schema is checked (embedded: installed) now; an external server that cannot be reached yet is
    waited for by the daemon (PostgreSQL down at start is not an error)."""
    try:
        conn = connect(target.dsn)
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
            raise click.BadParameter("a token is for --http-auth token", param_hint="--http-token")
        refuse_passwordless(dsn)
        return ConsoleAuth("postgres")
    if token is not None and len(token) < 16:
        raise click.BadParameter("the console token must be at least 16 characters", param_hint="--http-token")
    return ConsoleAuth("token", token)


async def _serve(daemon: Any, address: tuple[str, int] | None, demo: bool, max_connections: int | None,
                 request_timeout_s: float, auth: Any = None) -> None:
    from radixjobs.server.connections import raise_nofile_limit
    from radixjobs.server.http import http_limits, start_http

    daemon.install_signal_handlers()
    http_server = None
    if address is not None:
        limits = http_limits(daemon, max_connections, request_timeout_s)
        http_server, http_task, port = await start_http(daemon, *address, limits, auth)
        base = f"http://{address[0]}:{port}"
        logging.getLogger("radixjobs.server").info(
            "status %s/status metrics %s/metrics health %s/healthz node=%s http_max_connections=%s "
            "http_request_timeout_s=%s", base, base, base, daemon.config.node_id, limits.max_connections,
            limits.request_timeout_s, extra={"fields": {"http": base, "node": daemon.config.node_id,
                                                        "http_max_connections": limits.max_connections}})
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
        click.echo("demo job demo.heartbeat runs every 5 s: see `radixjobs jobs history demo.heartbeat` "
                   "or `radixjobs sql -c 'select * from demo.runs order by id desc limit 5'`", err=True)
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


@cli.command("status")
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


cli.add_command(docs_group)
cli.add_command(check_command)
