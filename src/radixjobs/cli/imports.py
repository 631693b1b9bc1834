"""``radixjobs import``: bring jobs over from other schedulers (today: pg_cron's ``cron.job``).

Exit code 0 when every row was created, already existed or was skipped (another database or node), 1 when
one was unmapped or refused (and on any error, as every command).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import click

from radixjobs import output
from radixjobs.cli.common import Options, common_options, database, emit

MAX_TIMEOUT_MS = 7 * 86_400_000  # as WITH (timeout = ...)
COLUMNS = ("pg_cron jobid", "jobname", "radixjobs job", "action", "reason")


@click.group("import")
def import_group() -> None:
    """Import jobs from other schedulers."""


@import_group.command("pg-cron")
@click.option("--dry-run", is_flag=True, help="Print the plan (each job admitted as its user, then rolled back); "
                                             "write nothing.")
@click.option("--schema", default="cron_import", show_default=True, metavar="SCHEMA",
              help="Schema of the new jobs and their wrapper procedures (created when missing; must be yours).")
@click.option("--database", "cron_database", default=None, metavar="DB",
              help="Import the pg_cron jobs that run in database DB (default: the connected database).")
@click.option("--cron-dsn", default=None, metavar="DSN",
              help="Read cron.job through this connection (pg_cron's own database); default: the target.")
@click.option("--timeout", default=None, metavar="INTERVAL",
              help="Timeout of each new job, e.g. '1 hour' (default: radixjobs' 4 minutes; pg_cron has none).")
@common_options
def import_pg_cron_command(opts: Options, dry_run: bool, schema: str, cron_database: str | None,
                           cron_dsn: str | None, timeout: str | None) -> None:
    """Create a radixjobs job for each pg_cron job (cron.job), as its user's own CREATE JOB would.

    Each job is created on a session logged in as the pg_cron job's user (its password from the password
    file), so that user owns the job and its wrapper procedure."""
    from radixjobs import schedule
    from radixjobs.db import connect
    from radixjobs.errors import ScheduleError
    from radixjobs.imports import pg_cron

    if not schema or len(schema.encode()) > 63:
        raise click.BadParameter("a schema name of 1 to 63 bytes", param_hint="--schema")
    if schema.lower().startswith("pg_"):
        raise click.BadParameter("schema names beginning with pg_ are reserved by PostgreSQL", param_hint="--schema")
    timeout_ms = None
    if timeout is not None:
        try:
            timeout_ms = max(1, schedule.parse_interval(timeout) // 1_000_000)
        except ScheduleError as exc:
            raise click.BadParameter(str(exc), param_hint="--timeout") from None
        if timeout_ms > MAX_TIMEOUT_MS:
            raise click.BadParameter(f"{timeout!r} is over the maximum of 7 days", param_hint="--timeout")
    with contextlib.ExitStack() as stack:
        conn = stack.enter_context(database(opts))
        source = stack.enter_context(connect(cron_dsn)) if cron_dsn else None
        outcomes = pg_cron.import_pg_cron(conn, schema=schema, database=cron_database, dry_run=dry_run,
                                          source=source, timeout_ms=timeout_ms)
    emit(opts, [o.to_json() for o in outcomes], _human(outcomes, dry_run))
    if pg_cron.failed(outcomes):
        sys.exit(1)  # (ctx.exit's code is dropped by cli.main's standalone_mode=False)


def _human(outcomes: list[Any], dry_run: bool) -> str:
    if not outcomes:
        return "cron.job has no rows this role may see: nothing to import"
    rows = [(o.jobid, o.jobname or "", o.job or "", o.action, o.reason) for o in outcomes]
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.action] = counts.get(o.action, 0) + 1
    summary = ", ".join(f"{n} {action}" for action, n in counts.items())
    prefix = "dry run, nothing written: " if dry_run else ""
    return output.render_table(COLUMNS, rows) + f"\n{prefix}{summary}"

