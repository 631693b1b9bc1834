"""The console's presentation helpers: schedules in words (radixjobs.timewords), percentiles, chart geometry."""

from __future__ import annotations

import datetime as dt

from radixjobs.server.console import present

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def test_schedules_in_words() -> None:
    assert present.schedule_words({"schedule_kind": "every", "interval_ns": 5_000_000_000}) == "every 5 seconds"
    assert present.schedule_words({"schedule_kind": "every", "interval_ns": 60_000_000_000}) == "every minute"
    assert present.schedule_words({"schedule_kind": "every", "interval_ns": 7_200_000_000_000}) == "every 2 hours"
    assert present.schedule_words({"schedule_kind": "every", "interval_ns": 1_500_000_000}) == "every 1.5 seconds"
    assert present.schedule_words({"schedule_kind": "cron", "cron_expression": "0 * * * *",
                                   "cron_time_zone": "Europe/Paris"}) == "every hour (Europe/Paris)"
    assert present.schedule_words({"schedule_kind": "at", "at_ns": 0}) == "once at 1970-01-01 00:00:00Z"
    assert present.schedule_words({"schedule_kind": "document", "schedule_text": "NOW() + INTERVAL '1 hour'"}) \
        == "document: NOW() + INTERVAL '1 hour'"


def test_relative_and_percentiles() -> None:
    assert present.relative(NOW + dt.timedelta(seconds=4), NOW) == "in 4 s"
    assert present.relative(NOW - dt.timedelta(minutes=3), NOW) == "3 min ago"
    assert present.percentile([], 0.5) is None
    assert present.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert present.percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def _attempt(age_s: float, late_s: float, status: str = "succeeded", attempt: int = 1) -> dict[str, object]:
    started = NOW - dt.timedelta(seconds=age_s)
    return {"started_at": started, "finished_at": started + dt.timedelta(seconds=1), "attempt": attempt,
            "status": status, "duration_s": 1.0, "lateness_s": late_s}


def test_lateness_chart_counts_first_attempts_of_the_last_hour() -> None:
    chart = present.lateness_chart([_attempt(10, 0.5), _attempt(20, 1.5), _attempt(30, 9, attempt=2),
                                    _attempt(4000, 99)], NOW)
    assert chart["samples"] == 2
    assert chart["p99_all"] == "1.5 s"


def test_timeline_places_attempts_in_the_window() -> None:
    chart = present.timeline([_attempt(300, 0.1), _attempt(900, 0.1), _attempt(60, 2, "failed", 2)], NOW, 600)
    assert len(chart["bars"]) == 2  # the one 900 s ago is outside the 10-minute window
    assert {b["cls"] for b in chart["bars"]} == {"ok", "bad"}
    assert all(0 <= float(b["x"]) <= chart["width"] for b in chart["bars"])
