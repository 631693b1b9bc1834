"""``radixjobs jobs``: list, show, the next ticks and the history of jobs, within the caller's rights."""

from __future__ import annotations

from typing import Any

import click

from radixjobs import output, timewords
from radixjobs.cli.common import Options, common_options, database, emit
from radixjobs.errors import RadixError
from radixjobs.model import HISTORY_STATUSES


@click.group("jobs")
def jobs_group() -> None:
    """List, inspect and run jobs."""


@jobs_group.command("list")
@common_options
def jobs_list(opts: Options) -> None:
    """Jobs (and CRON_TABLE documents, as doc:NUM) with schedule, principal, procedure, state, next run."""
    from radixjobs import catalog, documents

    with database(opts) as conn:
        jobs = [_with_next_run(job) for job in catalog.list_jobs(conn)]
        jobs = [{**job, "schedule_words": timewords.schedule_words(job)} for job in jobs]
        jobs += [{**doc, "schedule_words": ""} for doc in documents.overview(conn)]
    rows = [[job["name"], job["schedule"], job["schedule_words"], job["principal"], job["procedure"],
             job["enabled"], job["definition_version"], job["status"], timewords.instant(job["next_run_at"])]
            for job in jobs]
    emit(opts, jobs, output.render_table(LIST_HEADERS, rows))


LIST_HEADERS = ("name", "schedule", "in words", "principal", "procedure", "enabled", "definition_version", "status",
                "next run (UTC)")


def _with_next_run(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` with the next run of a CRON job no daemon has planned yet: the tick the engine will plan
    (``_upcoming``, as ``jobs next`` lists it); the database alone cannot evaluate a cron expression."""
    from datetime import UTC, datetime

    from radixjobs.errors import ScheduleError

    if job["next_run_at"] is not None or job["schedule_kind"] != "cron" or job["status"] != "scheduled":
        return job
    try:
        ticks = _upcoming(job, None, 1)
    except ScheduleError:
        return job  # the engine fails such a job (invalid_schedule) when it plans it
    if not ticks:
        return job
    return {**job, "next_run_at": datetime.fromtimestamp(ticks[0] // 1_000_000_000, UTC)}


@jobs_group.command("show")
@click.argument("name")
@common_options
def jobs_show(opts: Options, name: str) -> None:
    """One job in full (NAME is schema.name); times in UTC, the schedule also in words."""
    from datetime import datetime

    from radixjobs import catalog

    with database(opts) as conn:
        job = catalog.get_job(conn, name)
    if job is None:
        raise RadixError(f"job {name} does not exist (or is not visible to this role)")
    job = {**_with_next_run(job), "schedule_words": timewords.schedule_words(job)}
    human: dict[str, Any] = {}
    for key, value in job.items():
        if key != "schedule_words":
            human[key] = timewords.instant(value) if isinstance(value, datetime) else value
        if key == "schedule":
            human["in words"] = job["schedule_words"]
    human["arguments"] = catalog.describe_arguments(job["arguments"])
    human["timeout"] = catalog.describe_timeout(job["deadline_ms"])
    human["coalesce"] = "on" if job["coalesce_ticks"] else "off"
    human["batch"] = "on" if job["batch_ticks"] else "off"
    for option in ("start_deadline", "jitter"):
        ns = job[f"{option}_ns"]
        human[option] = "none" if ns is None else catalog.describe_timeout(ns // 1_000_000)
    human["history"] = human.pop("history_limit")
    human["group"] = human.pop("group_name") or "none"
    human["on_failure"] = job["on_failure"] or "none"
    human["time_zone"] = job["cron_time_zone"] if job["schedule_kind"] == "cron" else "(CRON only)"
    for direction in ("upstreams", "downstreams"):
        human[direction] = ", ".join(f"{edge['job']} {edge['on'].upper()}" for edge in job[direction]) or "none"
    emit(opts, job, output.render_mapping(human))


@jobs_group.command("groups")
@common_options
def jobs_groups(opts: Options) -> None:
    """The job groups this role may see: max_running, how many jobs are in each and how many run now."""
    from radixjobs import catalog

    with database(opts) as conn:
        groups = catalog.list_job_groups(conn)
    emit(opts, groups, output.render_records(groups, GROUP_COLUMNS))


GROUP_COLUMNS = ("name", "owner", "max_running", "jobs", "running")
MAX_NEXT = 1_000
LIVE_STATUSES = ("scheduled", "retry_wait", "running")


@jobs_group.command("next")
@click.argument("name")
@click.option("--count", default="10", show_default=True, metavar="N", help=f"How many ticks (1 to {MAX_NEXT}).")
@click.option("--from", "start", default=None, metavar="TIMESTAMP",
              help="List the schedule's ticks at or after TIMESTAMP (ISO-8601, UTC unless it has an offset), "
                   "whatever the job's state. Default: from the tick the engine has planned.")
@common_options
def jobs_next(opts: Options, name: str, count: str, start: str | None) -> None:
    """The next planned times of a job, computed by the engine's schedule code, in UTC and in the job's
    time zone (CRON; EVERY and AT ticks are shown in UTC twice)."""
    from radixjobs import catalog, schedule

    how_many = _next_count(count)
    try:
        start_ns = None if start is None else schedule.parse_timestamp(start)
    except RadixError as exc:
        raise RadixError(f"--from: {exc}") from None
    with database(opts) as conn:
        job = catalog.get_job(conn, name)
    if job is None:
        raise RadixError(f"job {name} does not exist (or is not visible to this role)")
    if job["schedule_kind"] == "after":
        raise RadixError(f"job {name} runs {job['schedule']}: it has no planned times of its own "
                         f"(each upstream tick that ends as named queues one with its planned time)")
    zone = job["cron_time_zone"] if job["schedule_kind"] == "cron" else "UTC"
    ticks = [{"planned_ns": tick, "utc": _iso(tick, "UTC"), "local": _iso(tick, zone)}
             for tick in _upcoming(job, start_ns, how_many)]
    human = output.render_table(("planned (UTC)", f"local ({zone})"), [[t["utc"], t["local"]] for t in ticks])
    if not ticks and start_ns is None:
        human += f"\njob {name} is {job['status']}: no tick planned (--from lists its schedule's ticks)"
    emit(opts, {"job": job["name"], "schedule": job["schedule"], "time_zone": zone, "status": job["status"],
                "ticks": ticks}, human)


def _next_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_NEXT:
        raise RadixError(f"--count must be a whole number from 1 to {MAX_NEXT}, got '{output.one_line(text, 20)}'")
    return value


def _upcoming(job: dict[str, Any], start_ns: int | None, count: int) -> list[int]:
    """Up to ``count`` ticks from the state's planned one (or the first at or after ``start_ns``), each next
    one as the engine plans it after running the one before (schedule.next_planned_after)."""
    from radixjobs import schedule
    from radixjobs.engine.definitions import schedule_of
    from radixjobs.errors import ScheduleError

    plan = schedule_of(job)
    anchor = job["anchor_ns"] if job["anchor_ns"] is not None else start_ns or 0
    if start_ns is not None:
        tick = schedule.next_planned_after(plan, anchor, start_ns - 1)
    elif job["status"] in LIVE_STATUSES and job["planned_ns"] is not None:
        tick = job["planned_ns"]
    elif job["status"] == "scheduled":  # a cron job the engine has not planned yet: as engine/planning.py
        tick = schedule.next_planned_after(plan, anchor, anchor)
    else:
        tick = None
    ticks: list[int] = []
    while tick is not None and tick <= schedule.INT64_MAX and len(ticks) < count:
        ticks.append(tick)
        try:
            tick = schedule.next_planned_after(plan, anchor, tick)
        except ScheduleError:
            break  # no tick within the supported range
    return ticks


def _iso(ns: int, zone: str) -> str:
    """``ns`` as ISO-8601 in ``zone`` with its offset (UTC: 'Z'), to the microsecond when not whole."""
    from datetime import datetime

    from radixjobs.schedule import load_time_zone

    moment = datetime.fromtimestamp(ns // 1_000_000_000, load_time_zone(zone))
    moment = moment.replace(microsecond=ns % 1_000_000_000 // 1_000)
    text = moment.isoformat()
    return text[:-6] + "Z" if zone == "UTC" else text


TERMINAL = ("succeeded", "failed")


@jobs_group.command("run")
@click.argument("name")
@click.option("--wait", is_flag=True, help="Wait for the attempt's outcome; exit 1 if it failed.")
@click.option("--wait-timeout", default=600.0, show_default=True, type=click.FloatRange(0.1, 7 * 86_400),
              metavar="SECONDS", help="With --wait: give up after SECONDS (a daemon must be running).")
@click.option("--from", "start", default=None, metavar="TIMESTAMP",
              help="Backfill: run every tick of the schedule from TIMESTAMP (with --to) that has not succeeded.")
@click.option("--to", "end", default=None, metavar="TIMESTAMP", help="Backfill: up to TIMESTAMP (excluded).")
@common_options
def jobs_run(opts: Options, name: str, wait: bool, wait_timeout: float, start: str | None, end: str | None) -> None:
    """RUN JOB: one attempt now, outside the schedule, as the job's principal (it waits for a running one);
    with --from/--to, RUN JOB ... FOR RANGE (a backfill)."""
    from radixjobs import catalog, schedule
    from radixjobs.errors import ScheduleError

    if (start is None) != (end is None):
        raise click.UsageError("give both --from and --to for a backfill")
    with database(opts) as conn:
        if start is not None and end is not None:
            if wait:
                raise click.UsageError("--wait is for one run, not a backfill")
            try:
                bounds = [schedule.parse_timestamp(value) for value in (start, end)]
            except ScheduleError as exc:
                raise click.BadParameter(str(exc), param_hint="--from/--to") from None
            queued = catalog.backfill_job(conn, name, bounds[0], bounds[1])
            emit(opts, {"job": name, "queued": queued}, f"queued {queued} tick(s) of {name}")
            return
        key = catalog.run_job(conn, name)
        if not wait:
            emit(opts, {"job": name, "idempotency_key": key}, f"queued a run of {name} (key {key})")
            return
        row = _wait_for_outcome(conn, key, wait_timeout)
    human = output.render_table(HISTORY_COLUMNS, [_history_row(row)])
    emit(opts, row, human)
    if row["status"] != "succeeded":
        raise SystemExit(1)


def _wait_for_outcome(conn: Any, key: str, timeout_s: float) -> dict[str, Any]:
    """The last attempt of the tick ``key`` once it succeeded or failed for good (polled)."""
    import time

    from psycopg.rows import dict_row

    deadline = time.monotonic() + timeout_s
    while True:
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute("SELECT * FROM radix.job_history WHERE idempotency_key = %s::pg_catalog.text "
                              "ORDER BY history_id DESC LIMIT 1", (key,)).fetchone()
        if row is not None and row["status"] in TERMINAL:
            return dict(row)
        if time.monotonic() > deadline:
            raise RadixError(f"no outcome for run {key} within {timeout_s:g} s: is a daemon (radixjobs serve) "
                             "running for this database?")
        time.sleep(0.2)


HISTORY_COLUMNS = ("status", "run", "planned_at", "started_at", "duration", "attempt", "category", "message")


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
    return [row["status"], row.get("run_kind", "schedule"), timewords.instant(row["planned_at"], milliseconds=True),
            timewords.instant(row["started_at"], milliseconds=True),
            timewords.elapsed(row["duration"]), row["attempt"], error.get("category") or "",
            output.wrapped(message)]  # whole, wrapped: a redacted error ends with what to do about it
