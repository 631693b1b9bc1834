"""The ``radixjobs`` command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
import psycopg

from radixjobs import migrate, output
from radixjobs.cli_common import (
    Options,
    common_options,
    database,
    emit,
    ensure_schema,
    max_per_principal_option,
)
from radixjobs.cli_docs import docs_group
from radixjobs.config import open_target
from radixjobs.db import connect, first_line
from radixjobs.embedded import EmbeddedServer
from radixjobs.errors import RadixError


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
@click.option("-c", "--command", "text", default=None, metavar="TEXT", help="SQL text to run.")
@click.option("-f", "--file", "file", default=None, type=click.File("r", encoding="utf-8"),
              help="SQL script to run ('-' for standard input).")
@common_options
def sql_command(opts: Options, text: str | None, file: Any) -> None:
    """Run SQL (and job DDL) from -c TEXT, -f FILE or standard input, statement by statement."""
    from radixjobs.scripts import run_script

    if text is not None and file is not None:
        raise click.UsageError("give either -c or -f, not both")
    if text is None:
        text = file.read() if file is not None else sys.stdin.read()
    with database(opts, pinned=False) as conn:  # the user's SQL, in the user's own search_path
        for result in run_script(conn, text):
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


@jobs_group.command("history")
@click.argument("name")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 256))
@common_options
def jobs_history(opts: Options, name: str, limit: int) -> None:
    """The newest attempts of a job."""
    from radixjobs import catalog

    with database(opts) as conn:
        if catalog.get_job(conn, name) is None:
            raise RadixError(f"job {name} does not exist (or is not visible to this role)")
        rows = catalog.job_history(conn, name, limit)
    emit(opts, rows, output.render_records(rows, ["planned_at", "attempt", "status", "node", "started_at",
                                                   "duration", "error"]))


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
@cli.command("serve")
@click.option("--http", "http", default="127.0.0.1:7317", show_default=True, metavar="HOST:PORT|off",
              help="Status endpoint address (port 0 picks a free port).")
@click.option("--http-max-connections", type=click.IntRange(1, 100_000), default=None, metavar="N",
              help="Most HTTP connections open at once; more are closed on accept. [default: from the "
                   "descriptor limit less what the scheduler needs, at most 64]")
@click.option("--http-request-timeout", type=click.FloatRange(0.1, 3600), default=10.0, show_default=True,
              metavar="SECONDS", help="Time an HTTP client gets to send a complete request (idle and slow "
                                      "clients are disconnected after it).")
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
                  all_databases: bool, node_id: str | None, concurrency: int,
                  per_database_concurrency: int, max_per_principal: int | None, grace: float, poll: float,
                  discovery_interval: float, lease_seconds: int, log_format: str, demo: bool,
                  services: tuple[str, ...]) -> None:
    """Run the scheduler daemon until SIGINT/SIGTERM."""
    import asyncio

    from radixjobs.server import Daemon, DaemonConfig
    from radixjobs.server.http import parse_http
    from radixjobs.server.logs import configure

    try:
        address = parse_http(http)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--http") from None
    allowed = {}
    for spec in services:
        name, sep, target_path = spec.partition("=")
        if not sep or not name or ":" not in target_path:
            raise click.BadParameter(f"expected NAME=module:function, got {spec!r}", param_hint="--service")
        allowed[name] = target_path
    configure(logging.INFO, log_format)
    with open_target(opts.dsn, opts.home) as target:
        with connect(target.dsn) as conn:
            ensure_schema(conn, target)
            if demo:
                _install_demo(conn)
        config = DaemonConfig(dsn=target.dsn, all_databases=all_databases or target.embedded is not None,
                              concurrency=concurrency, per_database_concurrency=per_database_concurrency,
                              max_per_principal=max_per_principal,
                              grace_s=grace, poll_s=poll, discovery_s=discovery_interval, services=allowed,
                              lease_s=lease_seconds)
        if node_id:
            config.node_id = node_id
        asyncio.run(_serve(Daemon(config), address, demo, http_max_connections, http_request_timeout))


async def _serve(daemon: Any, address: tuple[str, int] | None, demo: bool, max_connections: int | None,
                 request_timeout_s: float) -> None:
    from radixjobs.server.connections import raise_nofile_limit
    from radixjobs.server.http import http_limits, start_http

    daemon.install_signal_handlers()
    http_server = None
    if address is not None:
        limits = http_limits(daemon, max_connections, request_timeout_s)
        http_server, http_task, port = await start_http(daemon, *address, limits)
        base = f"http://{address[0]}:{port}"
        logging.getLogger("radixjobs.server").info(
            "status %s/status metrics %s/metrics health %s/healthz node=%s http_max_connections=%s "
            "http_request_timeout_s=%s", base, base, base, daemon.config.node_id, limits.max_connections,
            limits.request_timeout_s, extra={"fields": {"http": base, "node": daemon.config.node_id,
                                                        "http_max_connections": limits.max_connections}})
        click.echo(f"radixjobs serving (node {daemon.config.node_id}); status: {base}/status, "
                   f"metrics: {base}/metrics", err=True)
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
@click.option("--http", "http", default="127.0.0.1:7317", show_default=True, metavar="HOST:PORT",
              help="Where a running daemon answers.")
@common_options
def status_command(opts: Options, http: str) -> None:
    """Status of a running daemon, or (when none answers) of the database."""
    import json as jsonlib
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{http}/status", timeout=2) as response:
            value = {"source": "daemon", **jsonlib.loads(response.read())}
    except (OSError, ValueError):
        with database(opts) as conn:
            value = {"source": "database", **_database_status(conn)}
    human = output.render_mapping({k: v for k, v in value.items() if not isinstance(v, dict | list)})
    for key in ("counters", "jobs_by_status"):
        if isinstance(value.get(key), dict):
            human += "\n" + key + ":\n" + output.render_mapping(value[key])
    emit(opts, value, human)


def _database_status(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    by_status = dict(conn.execute("SELECT status, count(*) FROM radix.job_overview GROUP BY status").fetchall())
    nodes = conn.execute("SELECT count(*) FILTER (WHERE radix.node_alive(node_id)) FROM radix.nodes").fetchone()
    last = conn.execute("SELECT error FROM radix.job_history WHERE error IS NOT NULL "
                        "ORDER BY history_id DESC LIMIT 1").fetchone()
    return {"database": conn.info.dbname, "live_nodes": nodes[0] if nodes else 0, "jobs_by_status": by_status,
            "last_error": last[0] if last else None}


cli.add_command(docs_group)
