"""The ``radixjobs`` command line: the root group and the entry point; one module per command group."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click
import psycopg

from radixjobs.cli.check import check_command
from radixjobs.cli.common import Options
from radixjobs.cli.db import db_group
from radixjobs.cli.docs import docs_group
from radixjobs.cli.imports import import_group
from radixjobs.cli.jobs import jobs_group
from radixjobs.cli.run import run_command
from radixjobs.cli.serve import serve_command, status_command
from radixjobs.cli.sql import install_command, sql_command
from radixjobs.db import first_line
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


for _command in (sql_command, install_command, db_group, jobs_group, run_command, serve_command,
                 status_command, docs_group, check_command, import_group):
    cli.add_command(_command)


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
    except UnicodeError as exc:  # an argument that is no text, e.g. a file name with a lone surrogate
        click.echo(f"radixjobs: error: an argument is not valid text: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
