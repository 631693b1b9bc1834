"""The console's presentation helpers: schedules in words (radixjobs.timewords), relative times, percentiles."""

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
