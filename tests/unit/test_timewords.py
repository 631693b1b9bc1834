"""One language for time (radixjobs.timewords): what the CLI and the console both show."""

from __future__ import annotations

import datetime as dt

import pytest

from radixjobs import timewords
from radixjobs.server.console import present

S = 1_000_000_000


@pytest.mark.parametrize(("ns", "words"), [
    (5 * S, "5 seconds"), (60 * S, "1 minute"), (7200 * S, "2 hours"), (S + S // 2, "1.5 seconds"),
    (S // 4, "250 milliseconds"), (1_000, "0.001 milliseconds"), (86_400 * S + 1800 * S, "1 day 30 minutes"),
    (90 * S + S // 4, "1 minute 30.25 seconds"), (10 * S, "10 seconds"), (0, "0 seconds"),
])
def test_configured_intervals(ns: int, words: str) -> None:
    assert timewords.interval_words(ns) == words


@pytest.mark.parametrize(("seconds", "text"), [
    (0.34, "340 ms"), (1.25, "1.2 s"), (30, "30 s"), (125, "2 min 5 s"), (3 * 3600 + 720, "3 h 12 min"),
    (2 * 86_400 + 4 * 3600, "2 d 4 h"), (-0.2, "-200 ms"), (None, ""),
])
def test_measured_durations(seconds: float | None, text: str) -> None:
    assert timewords.elapsed(seconds) == text
    if seconds is not None:
        assert timewords.elapsed(dt.timedelta(seconds=seconds)) == text


def test_instants_are_utc_for_people_and_machines() -> None:
    berlin = dt.datetime(2026, 5, 1, 5, 0, 0, 125_000, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert timewords.instant(berlin) == "2026-05-01 03:00:00Z"
    assert timewords.instant(berlin, milliseconds=True) == "2026-05-01 03:00:00.125Z"
    assert timewords.iso(berlin) == "2026-05-01T03:00:00Z"
    assert timewords.instant(None) == timewords.iso(None) == ""
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert timewords.relative(now + dt.timedelta(hours=3), now) == "in 3 h"
    assert timewords.relative(now - dt.timedelta(days=3), now) == "3 d ago"


@pytest.mark.parametrize(("expression", "zone", "words"), [
    ("0 3 * * *", "UTC", "at 03:00 (UTC)"),
    ("0 9 * * 1-5", "Europe/Berlin", "at 09:00, Monday through Friday (Europe/Berlin)"),
    ("*/15 * * * *", "UTC", "every 15 minutes (UTC)"),
    ("30 0 3 * * *", "UTC", "at 03:00:30 (UTC)"),  # six fields: seconds first
    ("0 0 1 * 1", "UTC", "at 00:00, on day 1 of the month, or on Monday (UTC)"),  # OR-ed, as croniter does
    ("0 0 * * 7", "UTC", "at 00:00, only on Sunday (UTC)"),
    ("@daily", "Asia/Tokyo", "at 00:00 (Asia/Tokyo)"),
    ("@hourly", "UTC", "every hour (UTC)"),
    ("not cron", "UTC", "cron 'not cron' (UTC)"),  # never fails a page: shown as itself
])
def test_cron_in_words(expression: str, zone: str, words: str) -> None:
    assert timewords.cron_words(expression, zone) == words


def test_the_cli_and_the_console_say_the_same() -> None:
    row = {"schedule_kind": "cron", "cron_expression": "0 3 * * *", "cron_time_zone": "UTC"}
    assert present.schedule_words(row) == timewords.schedule_words(row) == "at 03:00 (UTC)"
    assert present.seconds(125) == timewords.elapsed(125)
    assert present.iso is timewords.iso
