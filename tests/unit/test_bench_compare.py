"""``bench/run.py compare``: its options and its table, on made-up figures (no server, no timing asserted)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psutil")  # the bench extra (bench/harness.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import run as bench_run
from scenarios import compare, compare_table


def test_options_default_and_narrowed() -> None:
    args = bench_run.parser().parse_args(["compare"])
    assert (args.jobs, args.tick_jobs, args.seconds, args.phase) == (5000, 200, 60.0, "aligned")
    assert args.peers == ["radixjobs", "procrastinate", "apscheduler", "pg_cron", "pgagent"]
    assert args.workloads == ["burst", "ticks"]  # pg_cron and pgAgent: the minute workloads only
    args = bench_run.parser().parse_args(["compare", "--jobs", "50", "--seconds", "5",
                                          "--peers", "apscheduler, radixjobs", "--workloads", "burst"])
    assert (args.jobs, args.seconds, args.peers, args.workloads) == (50, 5.0, ["radixjobs", "apscheduler"], ["burst"])


def test_unknown_peer_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_run.parser().parse_args(["compare", "--peers", "celery"])
    assert exit_info.value.code == 2
    assert "choose from radixjobs,procrastinate,apscheduler,pg_cron,pgagent" in capsys.readouterr().err


def test_expected_ticks_on_the_grid() -> None:
    # aligned: whole seconds 10..19 inside [9.5, 19.5); spread over 2 jobs: job 1 is due at x.5
    assert compare.peer_expected(3, "aligned", 9.5, 19.5) == 30
    assert compare.peer_expected(2, "spread", 10.0, 12.0) == 4


def _rep(rate: float, p99: float) -> dict[str, Any]:
    burst = {"jobs_per_s": rate, "scheduler_cpu_us_per_job": 800, "server_cpu_us_per_job": 900}
    ticks = {"lateness_p50_ms": 4.0, "lateness_p99_ms": p99, "ticks_missed": 0, "ticks_expected": 12000,
             "duplicate_ticks": 0}
    return {"baseline": {"commits_per_s": 2000.0, "client_cpu_us": 40.0, "server_cpu_us": 60.0},
            "peers": {"radixjobs": {"burst": burst, "ticks": ticks}, "apscheduler": {"burst": burst}}}


def test_table_shows_medians_ranges_and_ratios() -> None:
    settings = {"jobs": 5000, "tick_jobs": 200, "seconds": 60.0, "phase": "aligned", "concurrency": 8,
                "repeat": 3, "peers": ["radixjobs", "apscheduler"]}
    reps = [_rep(400.0, 20.0), _rep(500.0, 30.0), _rep(450.0, 25.0)]
    text = compare_table.render({"compare": {"settings": settings, "summary": compare.summarise(reps)},
                                 "environment": {"date_utc": "d", "commit": "c", "cpus": 2, "load_avg_1m": 1}})
    lines = text.splitlines()
    assert "baseline: one-connection commits/s 2,000" in lines[1]
    burst = next(line for line in lines if line.startswith("burst: jobs/s"))
    assert "450 [400–500] (0.225×)" in burst
    assert "17.0×" in next(line for line in lines if line.startswith("burst: CPU/job"))
    p99 = next(line for line in lines if line.startswith("ticks: lateness p99"))
    assert "25.0 [20.0–30.0]" in p99
    assert p99.rstrip().endswith("—")  # apscheduler ran no ticks here
    assert "0 (of 12,000)" in next(line for line in lines if line.startswith("ticks: missed"))
