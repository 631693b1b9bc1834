"""``radixjobs db``: the embedded PostgreSQL server."""

from __future__ import annotations

import sys

import click

from radixjobs import migrate
from radixjobs.cli.common import Options, common_options, emit
from radixjobs.db import connect
from radixjobs.embedded import EmbeddedServer
from radixjobs.errors import RadixError


@click.group("db")
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
