"""``bench/run.py compare``'s minute workloads: the figures from runs and effects, and the options (no server,
no timing asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("psutil")  # the bench extra (bench/harness.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import run as bench_run
from peers import cron_command, cron_expression
from scenarios import compare
from scenarios.cron_figures import analyse, by_order, by_start, peak_concurrency, settled_by_order

DUE = [600.0, 660.0, 720.0]


def test_pg_cron_rows_are_runs_of_the_due_minutes_in_order() -> None:
    rows = [(0, "succeeded"), (1, "failed"), (0, "succeeded"), (1, "succeeded"), (0, "succeeded"), (0, "running")]
    runs = by_order(rows, DUE)
    assert runs == [(0, 600.0, "succeeded"), (1, 600.0, "failed"), (0, 660.0, "succeeded"), (1, 660.0, "succeeded"),
                    (0, 720.0, "succeeded"), (0, None, "running")]
    assert settled_by_order(runs, 1, DUE)  # job 0: all three minutes ended; its fourth run is past the window
    assert not settled_by_order(runs, 2, DUE)  # job 1 has not run its third minute


def test_a_queue_behind_a_long_run_is_late_and_never_overlaps() -> None:
    # one job, each run 90 s: pg_cron starts the queued minutes one after another
    runs = by_order([(0, "succeeded")] * 3, DUE)
    effects = [(0, 600.05, 690.05), (0, 690.1, 780.1), (0, 780.2, 870.2)]
    figures = analyse(1, DUE, runs, effects)
    assert (figures["runs_succeeded"], figures["overlaps"], figures["missed_minutes"]) == (3, 0, 0)
    assert (figures["lateness_p50_ms"], figures["lateness_max_ms"]) == (30100.0, 60200.0)


def test_failures_missed_minutes_and_overlaps() -> None:
    runs = [(0, 600.0, "succeeded"), (0, 660.0, "failed"), (0, 720.0, "running"), (0, 780.0, "succeeded")]
    effects = [(0, 600.5, 700.0), (0, 690.0, 790.0)]  # the second started before the first ended
    figures = analyse(2, DUE, runs, effects)
    assert figures["start_failures"] == 1
    assert figures["failures_by_status"] == {"failed": 1}
    assert figures["unfinished"] == 1
    assert figures["missed_minutes"] == 3  # job 1 never ran
    assert figures["overlaps"] == 1
    assert figures["peak_running"] == 2
    assert figures["lateness_max_ms"] == 500.0  # the 780 run is outside the window
    assert peak_concurrency([(0, 1.0, 2.0), (1, 2.0, 3.0)]) == 1  # an end and a start at one instant


def test_every_peer_gets_the_same_expression_and_body() -> None:
    assert cron_expression("minute-burst", 3600.0 * 5 + 60 * 17) == "17 * * * *"
    assert cron_expression("minutely", 0.0) == "* * * * *"
    assert cron_command(7, 100) == "CALL bench.cron_work(7, 100)"


def test_minute_workloads_options() -> None:
    args = bench_run.parser().parse_args(["compare", "--peers", "pg_cron,radixjobs", "--workloads",
                                          "overrun,minute-burst", "--minutes", "3"])
    assert (args.peers, args.workloads, args.minutes) == (["radixjobs", "pg_cron"], ["minute-burst", "overrun"], 3)
    assert (args.cron_jobs, args.work_ms, args.overrun_seconds) == (1000, 100, 90.0)
    assert compare.needs_cron_cluster(args)
    assert not compare.runs_on("burst", "pg_cron")
    assert not compare.runs_on("minutely", "apscheduler")
    assert not compare.needs_cron_cluster(bench_run.parser().parse_args(["compare"]))


def test_pgagent_runs_take_the_last_due_minute_not_taken() -> None:
    # each run 90 s: 600 runs at 605, 660 is skipped (running), 720 runs at 700 + a poll
    rows = [(0, 605.0, "succeeded"), (0, 725.0, "succeeded"), (0, 845.0, "running"), (1, 610.0, "failed")]
    assert by_start(rows, DUE) == [(0, 600.0, "succeeded"), (0, 720.0, "succeeded"), (0, None, "running"),
                                   (1, 600.0, "failed")]
