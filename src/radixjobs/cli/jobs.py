"""``radixjobs jobs``: list, show and read the history of jobs, within the caller's rights."""

from __future__ import annotations

from typing import Any

import click

from radixjobs import output
from radixjobs.cli.common import Options, common_options, database, emit
from radixjobs.errors import RadixError
from radixjobs.model import HISTORY_STATUSES


@click.group("jobs")
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
