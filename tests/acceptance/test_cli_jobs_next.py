"""``radixjobs jobs next``: the next planned times as the engine computes them, within the caller's rights."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from psycopg.conninfo import make_conninfo

from radixjobs import catalog
from radixjobs.cli.jobs import jobs_group
from tests.acceptance.conftest import Run, run_cli
from tests.apps import App


def next_ticks(app: App, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(jobs_group, ["next", *args, "--json"], env={"RADIXJOBS_DSN": app.dsn})
    assert result.exit_code == 0, (result.output, result.exception)
    value: dict[str, Any] = json.loads(result.output)
    return value


def test_starting_at_ahead_is_listed_first(app: App) -> None:
    name = app.job("CREATE JOB app.later SCHEDULE EVERY INTERVAL '1 hour' STARTING AT TIMESTAMP "
                   "'2226-12-10T00:00:00Z' RUN AS {p} CALL app.record('x')")
    shown = next_ticks(app, name, "--count", "3")
    assert [t["utc"] for t in shown["ticks"]] == ["2226-12-10T00:00:00Z", "2226-12-10T01:00:00Z",
                                                  "2226-12-10T02:00:00Z"]
    assert shown["time_zone"] == "UTC"
    assert shown["ticks"][0]["planned_ns"] == app.state(name)["planned_ns"]  # the tick the engine has planned


def test_cron_ticks_in_the_jobs_zone_across_the_spring_gap(app: App) -> None:
    name = app.job("CREATE JOB app.nightly SCHEDULE CRON '30 2 * * *' TIME ZONE 'Europe/Berlin' RUN AS {p} "
                   "CALL app.record('x')")
    shown = next_ticks(app, name, "--from", "2027-03-27", "--count", "3")
    assert [(t["utc"], t["local"]) for t in shown["ticks"]] == [
        ("2027-03-27T01:30:00Z", "2027-03-27T02:30:00+01:00"),
        ("2027-03-28T01:00:00Z", "2027-03-28T03:00:00+02:00"),  # 02:30 is skipped: right after the jump
        ("2027-03-29T00:30:00Z", "2027-03-29T02:30:00+02:00"),
    ]
    human = CliRunner().invoke(jobs_group, ["next", name, "--from", "2027-03-27", "--count", "2"],
                               env={"RADIXJOBS_DSN": app.dsn})
    assert "local (Europe/Berlin)" in human.output
    assert "2027-03-28T03:00:00+02:00" in human.output
    assert "(2 rows)" in human.output


def test_a_new_cron_job_is_listed_with_the_next_run_the_engine_will_plan(app: App) -> None:
    name = app.job("CREATE JOB app.nightly SCHEDULE CRON '0 3 * * *' TIME ZONE 'Asia/Tokyo' RUN AS {p} "
                   "CALL app.record('x')")
    assert app.state(name)["planned_ns"] is None  # no daemon has planned it
    result = CliRunner().invoke(jobs_group, ["list", "--json"], env={"RADIXJOBS_DSN": app.dsn})
    assert result.exit_code == 0, (result.output, result.exception)
    (listed,) = (j for j in json.loads(result.output) if j["name"] == name)
    first = next_ticks(app, name, "--count", "1")["ticks"][0]
    assert listed["next_run_at"] == first["utc"].replace("Z", "+00:00")
    assert first["local"].endswith("T03:00:00+09:00")
    assert listed["schedule_words"] == "at 03:00 (Asia/Tokyo)"
    human = CliRunner().invoke(jobs_group, ["list"], env={"RADIXJOBS_DSN": app.dsn}).output
    line = next(line for line in human.splitlines() if line.startswith(name))
    # the schedule in words beside the expression, and the next run in UTC as every CLI time is
    assert "CRON '0 3 * * *' TIME ZONE 'Asia/Tokyo' | at 03:00 (Asia/Tokyo)" in line
    assert first["utc"].replace("T", " ") in line
    shown = CliRunner().invoke(jobs_group, ["show", name], env={"RADIXJOBS_DSN": app.dsn}).output
    assert "in words" in shown
    assert "at 03:00 (Asia/Tokyo)" in shown
    assert first["utc"].replace("T", " ") in shown  # its next run too


def test_one_time_and_disabled_jobs(app: App) -> None:
    once = app.job("CREATE JOB app.once SCHEDULE AT TIMESTAMP '2226-01-01T00:00:00Z' RUN AS {p} CALL app.record('x')")
    assert [t["utc"] for t in next_ticks(app, once, "--count", "5")["ticks"]] == ["2226-01-01T00:00:00Z"]
    assert next_ticks(app, once, "--from", "2226-01-01T00:00:01Z")["ticks"] == []
    off = app.job("CREATE JOB app.off SCHEDULE EVERY INTERVAL '1 day' STARTING AT TIMESTAMP '2030-01-01' "
                  "RUN AS {p} CALL app.record('x') DISABLE")
    assert next_ticks(app, off)["ticks"] == []
    listed = next_ticks(app, off, "--from", "2030-01-01", "--count", "2")["ticks"]
    assert [t["utc"] for t in listed] == ["2030-01-01T00:00:00Z", "2030-01-02T00:00:00Z"]


def test_an_interval_job_without_starting_at_counts_from_its_arming(app: App) -> None:
    name = app.job("CREATE JOB app.often SCHEDULE EVERY INTERVAL '10 minutes' RUN AS {p} CALL app.record('x')")
    state = app.state(name)
    shown = [t["planned_ns"] for t in next_ticks(app, name, "--count", "3")["ticks"]]
    assert shown == [state["planned_ns"] + k * 600 * 10**9 for k in range(3)]
    assert [t["planned_ns"] for t in next_ticks(app, name, "--from", "2000-01-01", "--count", "1")["ticks"]] == \
        [state["planned_ns"]]  # the arming instant is the grid's origin, never a tick


@pytest.mark.parametrize(("args", "message"), [
    (["app.nope"], "job app.nope does not exist (or is not visible to this role)"),
    (["app.seen", "--from", "tomorrow"], "--from: invalid timestamp 'tomorrow'"),
    (["app.seen", "--count", "0"], "--count must be a whole number from 1 to 1000, got '0'"),
    (["app.seen", "--count", "1001"], "--count must be a whole number from 1 to 1000"),
    (["app.seen", "--count", "many"], "--count must be a whole number from 1 to 1000, got 'many'"),
])
def test_bad_input_is_one_line(app: App, cli: Run, args: list[str], message: str) -> None:
    app.job("CREATE JOB app.seen SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('x')")
    result = cli("jobs", "next", *args)
    assert result.returncode == 1
    assert result.stderr.startswith("radixjobs: error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_a_role_sees_only_the_jobs_it_may_see(app: App) -> None:
    name = app.job("CREATE JOB app.hidden SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('x')")
    assert catalog.get_job(app.conn, name) is not None
    as_principal = make_conninfo(app.dsn, user=app.principal)  # runs the job, does not own it
    result = run_cli("jobs", "next", name, env={"RADIXJOBS_DSN": as_principal})
    assert result.returncode == 1
    assert "does not exist (or is not visible to this role)" in result.stderr
