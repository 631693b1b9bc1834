"""Schedule arithmetic: intervals, timestamps, cron ticks (with DST), the grid and coalescing."""

from __future__ import annotations

import calendar
import contextlib
from datetime import datetime

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from radixjobs.engine.planning import latest_due_tick, plan_stands
from radixjobs.errors import ScheduleError
from radixjobs.model import AtSchedule, CronSchedule, EverySchedule
from radixjobs.schedule import (
    MAX_INTERVAL_NS,
    coalesce,
    first_tick_after,
    initial_planned,
    load_time_zone,
    next_cron_tick,
    next_planned_after,
    parse_interval,
    parse_timestamp,
    validate_cron,
)

S = 10**9
MINUTE, HOUR, DAY = 60 * S, 3_600 * S, 86_400 * S


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    """UTC nanoseconds of a wall-clock UTC time (independent of the code under test)."""
    return calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)) * S


# ------------------------------------------------------------------------------------------------ intervals

INTERVALS = [
    ("5 minute", 5 * MINUTE),
    ("5 minutes", 5 * MINUTE),
    ("5min", 5 * MINUTE),
    ("5 MINS", 5 * MINUTE),
    ("5m", 5 * MINUTE),
    ("30 s", 30 * S),
    ("30sec", 30 * S),
    ("1 second", S),
    ("2 hours", 2 * HOUR),
    ("2 hr", 2 * HOUR),
    ("2hrs", 2 * HOUR),
    ("2H", 2 * HOUR),
    ("1 day", DAY),
    ("3 days", 3 * DAY),
    ("3d", 3 * DAY),
    ("1 week", 7 * DAY),
    ("2 wks", 14 * DAY),
    ("1w", 7 * DAY),
    ("1 hour 30 minutes", 90 * MINUTE),
    ("1h30m", 90 * MINUTE),
    ("1h 30m 15s", 90 * MINUTE + 15 * S),
    ("1.5 hours", 90 * MINUTE),
    (".5 h", 30 * MINUTE),
    ("0.001 s", 1_000_000),
    ("250 ms", 250_000_000),
    ("0.000000001 seconds", 1),
    ("02:00:00", 2 * HOUR),
    ("02:30", 150 * MINUTE),
    ("00:00:00.000001", 1_000),
    ("1 day 02:00:00", DAY + 2 * HOUR),
    ("  1 Day  ", DAY),
    ("5 minutes 5 minutes", 10 * MINUTE),  # a repeated unit adds
    ("1 hour -10 minutes", 50 * MINUTE),
    ("36525 days", MAX_INTERVAL_NS),
]


@pytest.mark.parametrize(("text", "expected"), INTERVALS)
def test_parse_interval_accepts(text: str, expected: int) -> None:
    assert parse_interval(text) == expected


BAD_INTERVALS = [
    ("", "interval is empty"),
    ("   ", "interval is empty"),
    ("5", "missing unit after '5'"),
    ("1 hour 30", "missing unit after '30'"),
    ("5 5 minutes", "missing unit after '5'"),
    ("minutes", "unit 'minutes' has no number before it"),
    ("1 month", "calendar unit 'month' is not allowed in an interval: use days or weeks"),
    ("2 mons", "calendar unit 'mons' is not allowed"),
    ("1 year", "calendar unit 'year' is not allowed"),
    ("1y", "calendar unit 'y' is not allowed"),
    ("1 yr", "calendar unit 'yr' is not allowed"),
    ("1 decade", "calendar unit 'decade' is not allowed"),
    ("1 century", "calendar unit 'century' is not allowed"),
    ("1 millennium", "calendar unit 'millennium' is not allowed"),
    ("month", "calendar unit 'month' is not allowed"),
    ("0 minutes", "interval must be positive"),
    ("-5 minutes", "interval must be positive"),
    ("1 hour -2 hours", "interval must be positive"),
    ("00:00:00", "interval must be positive"),
    ("5 minutes ago", "'ago' is not allowed"),
    ("3 fortnights", "unknown interval unit 'fortnights'"),
    ("1 ns", "unknown interval unit 'ns'"),
    ("5 minutes!", "unexpected '!' in interval"),
    ("@ 5 minutes", "unexpected '@' in interval"),
    ("00:61:00", "time field out of range"),
    ("0.0000000001 s", "not a whole number of nanoseconds"),
    ("36526 days", "interval too large"),
    ("1" + "0" * 40 + " weeks", "interval too large"),
    ("abc", "unknown interval unit 'abc'"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_INTERVALS)
def test_parse_interval_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_interval(text)
    assert fragment in str(caught.value)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_parse_interval_raises_only_schedule_error(text: str) -> None:
    with contextlib.suppress(ScheduleError):
        assert parse_interval(text) > 0


# ----------------------------------------------------------------------------------------------- timestamps

TIMESTAMPS = [
    ("2026-01-01", utc(2026, 1, 1)),
    ("1970-01-01T00:00:00Z", 0),
    ("2026-01-01T03:00:00Z", utc(2026, 1, 1, 3)),
    ("2026-01-01t03:00:00z", utc(2026, 1, 1, 3)),
    ("2026-01-01 03:00:00", utc(2026, 1, 1, 3)),
    ("2026-01-01 03:00", utc(2026, 1, 1, 3)),
    ("2026-01-01T03:00:00+01:00", utc(2026, 1, 1, 2)),
    ("2026-01-01T03:00:00+0130", utc(2026, 1, 1, 1, 30)),
    ("2026-01-01T03:00:00-05", utc(2026, 1, 1, 8)),
    ("2026-01-01 03:00:00 +05:30", utc(2026, 1, 1, 3) - 330 * MINUTE),
    ("2026-01-01T00:00:00.5Z", utc(2026, 1, 1) + S // 2),
    ("2026-01-01T00:00:00.123456789Z", utc(2026, 1, 1) + 123_456_789),
    ("2026-01-01T00:00:00,000000001", utc(2026, 1, 1) + 1),
    ("2262-04-11T23:47:16.854775807Z", 2**63 - 1),
    ("1969-12-31T23:59:59.999999999Z", -1),
    ("2024-02-29", utc(2024, 2, 29)),
    ("  2026-06-30T12:00:00Z  ", utc(2026, 6, 30, 12)),
]


@pytest.mark.parametrize(("text", "expected"), TIMESTAMPS)
def test_parse_timestamp_accepts(text: str, expected: int) -> None:
    assert parse_timestamp(text) == expected


BAD_TIMESTAMPS = [
    ("", "invalid timestamp"),
    ("tomorrow", "invalid timestamp 'tomorrow'"),
    ("now", "invalid timestamp"),
    ("2026/01/01", "invalid timestamp"),
    ("2026-01-01T", "invalid timestamp"),
    ("26-01-01", "invalid timestamp"),
    ("2026-01-01 03", "invalid timestamp"),
    ("2026-01-01 03:00:00 Europe/Berlin", "invalid timestamp"),
    ("2026-02-30", "date out of range"),
    ("2025-02-29", "date out of range"),
    ("2026-13-01", "date out of range"),
    ("0000-01-01", "date out of range"),
    ("2026-01-01 24:00:00", "time out of range"),
    ("2026-01-01 23:60:00", "time out of range"),
    ("2026-01-01 23:59:60", "time out of range"),
    ("2026-01-01 03:00:00+25:00", "time zone offset out of range"),
    ("2026-01-01 03:00:00.1234567891", "more than 9 fractional digits"),
    ("1000-01-01", "timestamp out of range"),
    ("2262-04-12", "timestamp out of range"),
    ("9999-12-31T23:59:59Z", "timestamp out of range"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_TIMESTAMPS)
def test_parse_timestamp_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_timestamp(text)
    assert fragment in str(caught.value)


@settings(max_examples=200, deadline=None)
@given(
    st.datetimes(),
    st.integers(0, 999_999_999),
    st.integers(-14 * 60, 14 * 60),
)
def test_parse_timestamp_round_trips_nanoseconds_and_offsets(moment: datetime, nanos: int, offset_minutes: int) -> None:
    local = moment.replace(microsecond=0)
    sign = "-" if offset_minutes < 0 else "+"
    hours, minutes = divmod(abs(offset_minutes), 60)
    text = f"{local.isoformat()}.{nanos:09d}{sign}{hours:02d}:{minutes:02d}"
    expected = (calendar.timegm(local.timetuple()) - offset_minutes * 60) * S + nanos
    if -(2**63) <= expected < 2**63:
        assert parse_timestamp(text) == expected
    else:
        with pytest.raises(ScheduleError, match="out of range"):
            parse_timestamp(text)


# ----------------------------------------------------------------------------------------------------- cron

CRON_TICKS = [
    # (expression, zone, after, expected)
    ("*/5 * * * *", "UTC", utc(2026, 1, 1, 0, 0, 1), utc(2026, 1, 1, 0, 5)),
    ("*/5 * * * *", "UTC", utc(2026, 1, 1, 0, 5), utc(2026, 1, 1, 0, 10)),  # strictly after
    ("*/5 * * * *", "UTC", utc(2026, 1, 1, 0, 5) - 1, utc(2026, 1, 1, 0, 5)),
    ("0 3 * * *", "UTC", utc(2026, 1, 1, 3) + 1, utc(2026, 1, 2, 3)),
    ("0 3 * * mon-fri", "UTC", utc(2026, 1, 2, 4), utc(2026, 1, 5, 3)),  # Fri → Mon
    ("0 0 1 * *", "UTC", utc(2026, 1, 15), utc(2026, 2, 1)),
    ("0 0 29 2 *", "UTC", utc(2026, 1, 1), utc(2028, 2, 29)),
    ("@hourly", "UTC", utc(2026, 1, 1, 0, 30), utc(2026, 1, 1, 1)),
    ("@daily", "UTC", utc(2026, 1, 1, 0, 30), utc(2026, 1, 2)),
    # six fields: seconds first
    ("*/15 * * * * *", "UTC", utc(2026, 1, 1, 0, 0, 1), utc(2026, 1, 1, 0, 0, 15)),
    ("30 0 3 * * *", "UTC", utc(2026, 1, 1), utc(2026, 1, 1, 3, 0, 30)),
    ("0 3 * * *", "Europe/Berlin", utc(2026, 1, 1), utc(2026, 1, 1, 2)),  # CET = UTC+1
    ("0 3 * * *", "Europe/Berlin", utc(2026, 7, 1), utc(2026, 7, 1, 1)),  # CEST = UTC+2
    ("0 3 * * *", "America/New_York", utc(2026, 1, 1), utc(2026, 1, 1, 8)),
]


@pytest.mark.parametrize(("expression", "zone", "after", "expected"), CRON_TICKS)
def test_next_cron_tick(expression: str, zone: str, after: int, expected: int) -> None:
    assert next_cron_tick(expression, zone, after) == expected


def ticks(expression: str, zone: str, after: int, count: int) -> list[int]:
    out: list[int] = []
    for _ in range(count):
        after = next_cron_tick(expression, zone, after)
        out.append(after)
    return out


def test_berlin_spring_forward_runs_the_missing_local_time_right_after_the_jump() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day
    assert ticks("30 2 * * *", "Europe/Berlin", utc(2026, 3, 27, 12), 3) == [
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST, the first instant after the jump
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


def test_several_skipped_times_of_a_day_run_once_after_the_jump() -> None:
    assert ticks("0,15,30 2 * * *", "Europe/Berlin", utc(2026, 3, 29), 2) == [
        utc(2026, 3, 29, 1, 0),  # 02:00, 02:15 and 02:30 collapse into one run at 03:00 CEST
        utc(2026, 3, 30, 0, 0),
    ]
    assert ticks("30 2,3 * * *", "Europe/Berlin", utc(2026, 3, 29), 3) == [
        utc(2026, 3, 29, 1, 0),  # 02:30 (skipped) at 03:00 CEST
        utc(2026, 3, 29, 1, 30),  # 03:30 CEST
        utc(2026, 3, 30, 0, 30),
    ]
    assert ticks("0 2,3 * * *", "Europe/Berlin", utc(2026, 3, 29), 2) == [
        utc(2026, 3, 29, 1, 0),  # 02:00 (skipped) and 03:00 are the same instant: one run
        utc(2026, 3, 30, 0, 0),
    ]


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Tokyo",
                                  "America/Santiago", "Europe/London"])
@pytest.mark.parametrize("expression", ["30 2 * * *", "0 1 * * *", "45 23 * * *", "59 59 1 * * *", "@daily"])
def test_a_daily_job_runs_exactly_once_every_local_day(zone: str, expression: str) -> None:
    tz = load_time_zone(zone)
    days = [datetime.fromtimestamp(t // S, tz).date() for t in ticks(expression, zone, utc(2026, 1, 1), 730)]
    assert len(set(days)) == len(days)  # never twice on one day
    assert (days[-1] - days[0]).days == len(days) - 1  # never a day without


def test_berlin_spring_forward_hourly() -> None:
    assert ticks("0 * * * *", "Europe/Berlin", utc(2026, 3, 28, 23, 30), 3) == [
        utc(2026, 3, 29, 0),  # 01:00 CET
        utc(2026, 3, 29, 1),  # 03:00 CEST (02:00 skipped)
        utc(2026, 3, 29, 2),  # 04:00 CEST
    ]


def test_berlin_fall_back_runs_a_repeated_time_once_at_its_first_occurrence() -> None:
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:00–02:59 happen twice
    assert ticks("30 2 * * *", "Europe/Berlin", utc(2026, 10, 24, 12), 2) == [
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, the first occurrence
        utc(2026, 10, 26, 1, 30),  # 02:30 CET next day; not 01:30Z on the 25th
    ]
    assert next_cron_tick("30 2 * * *", "Europe/Berlin", utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 26, 1, 30)


def test_berlin_fall_back_wildcard_jobs_run_by_the_wall_clock() -> None:
    assert ticks("*/30 * * * *", "Europe/Berlin", utc(2026, 10, 24, 23, 45), 5) == [
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST
        utc(2026, 10, 25, 1, 0),  # 02:00 CET: the wall clock shows 02:00 again
        utc(2026, 10, 25, 1, 30),  # 02:30 CET
        utc(2026, 10, 25, 2, 0),  # 03:00 CET
    ]
    assert ticks("*/15 2 * * *", "Europe/Berlin", utc(2026, 10, 24, 23, 50), 9)[-2:] == [
        utc(2026, 10, 25, 1, 45),  # 02:45 CET: all eight quarters of both 2 o'clock hours
        utc(2026, 10, 26, 1, 0),
    ]


def test_berlin_fall_back_from_inside_the_second_occurrence() -> None:
    second_occurrence = utc(2026, 10, 25, 1, 10)  # 02:10 CET
    assert next_cron_tick("*/30 * * * *", "Europe/Berlin", second_occurrence) == utc(2026, 10, 25, 1, 30)
    assert next_cron_tick("*/20 * * * * *", "Europe/Berlin", second_occurrence) == utc(2026, 10, 25, 1, 10, 20)
    first_occurrence = utc(2026, 10, 25, 0, 40)  # 02:40 CEST: 02:45 CEST comes before 02:00 CET
    assert next_cron_tick("*/15 * * * *", "Europe/Berlin", first_occurrence) == utc(2026, 10, 25, 0, 45)
    assert next_cron_tick("*/15 * * * *", "Europe/Berlin", utc(2026, 10, 25, 0, 45)) == utc(2026, 10, 25, 1)


def test_spring_forward_wildcard_jobs_skip_what_the_wall_clock_skips() -> None:
    assert ticks("15 * * * *", "Europe/Berlin", utc(2026, 3, 29, 0), 2) == [
        utc(2026, 3, 29, 0, 15),  # 01:15 CET
        utc(2026, 3, 29, 1, 15),  # 03:15 CEST: 02:15 does not exist and is not made up
    ]


def test_new_york_spring_forward() -> None:
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT
    assert ticks("30 2 * * *", "America/New_York", utc(2026, 3, 7, 12), 2) == [
        utc(2026, 3, 8, 7, 0),  # the 8th has no 02:30: 03:00 EDT
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
    ]
    assert ticks("0 * * * *", "America/New_York", utc(2026, 3, 8, 6, 30), 2) == [
        utc(2026, 3, 8, 7),  # 03:00 EDT (02:00 skipped)
        utc(2026, 3, 8, 8),
    ]


def test_new_york_fall_back() -> None:
    # 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:00–01:59 happen twice
    assert ticks("30 1 * * *", "America/New_York", utc(2026, 10, 31, 12), 2) == [
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT
        utc(2026, 11, 2, 6, 30),  # 01:30 EST next day
    ]
    assert ticks("0 * * * *", "America/New_York", utc(2026, 11, 1, 4, 30), 3) == [
        utc(2026, 11, 1, 5),  # 01:00 EDT
        utc(2026, 11, 1, 6),  # 01:00 EST: an hourly job runs every hour of the wall clock
        utc(2026, 11, 1, 7),  # 02:00 EST
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["*/7 * * * *", "0 2 * * *", "30 1,2,3 * * *", "*/20 * * * * *", "0 0 1 * *"]),
    st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
    st.integers(utc(2025, 1, 1), utc(2027, 1, 1)),
    st.integers(0, 100),
)
def test_next_cron_tick_is_the_first_tick_strictly_after(
    expression: str, zone: str, after: int, fraction_percent: int
) -> None:
    tick = next_cron_tick(expression, zone, after)
    assert tick > after
    assert tick % S == 0
    # any instant between ``after`` and the tick has the same next tick: nothing was skipped over
    between = after + (tick - 1 - after) * fraction_percent // 100
    assert next_cron_tick(expression, zone, between) == tick
    assert next_cron_tick(expression, zone, tick - 1) == tick


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["*/7 * * * *", "15 * * * *", "*/20 1-3 * * *", "@hourly", "*/30 * * * *"]),
    st.sampled_from([("Europe/Berlin", utc(2026, 3, 29, 1)), ("Europe/Berlin", utc(2026, 10, 25, 1)),
                     ("Australia/Lord_Howe", utc(2026, 4, 4, 15)), ("Australia/Lord_Howe", utc(2026, 10, 3, 15, 30)),
                     ("America/New_York", utc(2026, 11, 1, 6))]),
    st.integers(-4 * 3_600, 4 * 3_600),
)
def test_wall_clock_jobs_fire_whenever_the_wall_clock_matches(
    expression: str, transition: tuple[str, int], offset_s: int
) -> None:
    zone, at = transition
    after = at + offset_s * S
    tz = load_time_zone(zone)
    minute = (after // S // 60 + 1) * 60
    while not croniter.match(expression, datetime.fromtimestamp(minute, tz).replace(tzinfo=None)):
        minute += 60  # every UTC minute, read on the wall clock: the brute-force answer
    assert next_cron_tick(expression, zone, after) == minute * S


BAD_CRONS = [
    ("", "UTC", "has 0 fields"),
    ("* * * *", "UTC", "has 4 fields: use 5 (min hour dom mon dow) or 6 (sec min hour dom mon dow)"),
    ("* * * * * * 2026", "UTC", "has 7 fields"),
    ("60 * * * *", "UTC", "invalid cron expression '60 * * * *'"),
    ("* 24 * * *", "UTC", "invalid cron expression"),
    ("*/0 * * * *", "UTC", "invalid cron expression"),
    ("a b c d e", "UTC", "invalid cron expression"),
    ("R * * * *", "UTC", "random and hashed fields (R, H) are not supported"),
    ("H/5 * * * *", "UTC", "random and hashed fields"),
    ("0 0 31 2 *", "UTC", "never fires"),
    ("@reboot", "UTC", "has 1 fields"),
    ("0 3 * * *", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
    ("0 3 * * *", "", "unknown time zone"),
    ("0 3 * * *", "localtime", "unknown time zone"),
    ("0 3 * * *", "../../etc/passwd", "unknown time zone"),
]


@pytest.mark.parametrize(("expression", "zone", "fragment"), BAD_CRONS)
def test_validate_cron_rejects(expression: str, zone: str, fragment: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        validate_cron(expression, zone)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    "expression", ["* * * * *", "0 3 * * mon-fri", "0 0 L * *", "0 0 * * 1#2", "*/10 * * * * *", "@weekly"]
)
def test_validate_cron_accepts(expression: str) -> None:
    validate_cron(expression, "Europe/Berlin")


def test_load_time_zone() -> None:
    assert str(load_time_zone("Europe/Berlin")) == "Europe/Berlin"
    assert str(load_time_zone("UTC")) == "UTC"


# ----------------------------------------------------------------------------------------- grid, coalesce


def test_first_tick_after_examples() -> None:
    assert first_tick_after(0, 10, 0) == 10  # strictly after: the anchor is past
    assert first_tick_after(0, 10, -5) == 0  # before the anchor: the anchor itself
    assert first_tick_after(0, 10, 9) == 10
    assert first_tick_after(0, 10, 10) == 20  # strictly after
    assert first_tick_after(3, 10, 25) == 33
    with pytest.raises(ScheduleError):
        first_tick_after(0, 0, 0)


@settings(max_examples=300)
@given(st.integers(-(2**62), 2**62), st.integers(1, 10**15), st.integers(-(2**62), 2**62))
def test_first_tick_after_is_on_the_grid_after_and_minimal(anchor: int, interval: int, after: int) -> None:
    tick = first_tick_after(anchor, interval, after)
    assert (tick - anchor) % interval == 0
    assert tick > after
    assert tick >= anchor
    assert tick == anchor or tick - interval <= after  # the previous grid point is not a valid answer


def test_coalesce_after_two_hours_down_runs_the_latest_tick_once() -> None:
    anchor = utc(2026, 1, 1)
    planned = anchor + 5 * MINUTE
    now = planned + 2 * HOUR + 90 * S
    assert coalesce(anchor, 5 * MINUTE, planned, now) == (planned + 2 * HOUR, 24)


def test_coalesce_examples() -> None:
    assert coalesce(0, 10, 30, 25) == (30, 0)  # planned still in the future
    assert coalesce(0, 10, 30, 30) == (30, 0)  # due exactly now: nothing skipped
    assert coalesce(0, 10, 30, 39) == (30, 0)
    assert coalesce(0, 10, 30, 40) == (40, 1)
    assert coalesce(0, 10, 30, 75) == (70, 4)  # 30, 40, 50, 60 skipped; 70 runs
    assert coalesce(0, 10, 35, 75) == (70, 4)  # off-grid plan: 35, 40, 50, 60 skipped
    assert coalesce(0, 10, 35, 38) == (35, 0)


@settings(max_examples=300)
@given(
    st.integers(-(2**60), 2**60),
    st.integers(1, 10**13),
    st.integers(1, 10**4),
    st.integers(0, 10**17),
)
def test_coalesce_properties(anchor: int, interval: int, k: int, late: int) -> None:
    planned = anchor + k * interval
    now = planned + late
    tick, skipped = coalesce(anchor, interval, planned, now)
    assert (tick - anchor) % interval == 0
    assert tick <= now < tick + interval
    assert tick >= planned
    assert skipped == (tick - planned) // interval
    assert coalesce(anchor, interval, planned, planned - 1 - late) == (planned, 0)


# A cron job's spacing of ticks, roughly: horizons are drawn in these units.
CRON_UNITS = {("*/7 * * * * *", "UTC"): 7 * S, ("*/15 * * * *", "UTC"): 15 * MINUTE,
              ("30 2 * * *", "Europe/Berlin"): DAY, ("0 0 1 1 *", "UTC"): 366 * DAY}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(CRON_UNITS)), st.integers(0, 10**6), st.sampled_from([1, 2, 5]),
       st.integers(-3, 12), st.integers(0, 12), st.integers(0, 12))
def test_a_remembered_plan_stands_exactly_when_coalescing_again_keeps_it(
        cron: tuple[str, str], start: int, keep: int, first: int, second: int, third: int) -> None:
    """planning.plan_stands, from nothing known or from what it or the coalescing walk learnt at an earlier
    horizon, says a plan stands exactly when coalescing from it again (latest_due_tick) keeps it."""
    expression, zone = cron
    unit = CRON_UNITS[cron]
    planned = next_cron_tick(expression, zone, utc(2026, 3, 1) + start * S)

    def kept(tick: int, horizon: int) -> bool:
        return latest_due_tick(expression, zone, tick, horizon, keep)[0] == tick

    ahead = None
    horizon = planned + first * unit
    for step in (0, second, third):  # horizons that only move on, as the database clock does
        horizon += step * unit
        stands, ahead = plan_stands(expression, zone, planned, horizon, keep, ahead)
        assert stands == kept(planned, horizon)
    tick, _, walked = latest_due_tick(expression, zone, planned, planned + first * unit, keep)
    assert walked is not None
    assert walked[0] <= keep
    assert walked[1] > planned + first * unit
    later = planned + (first + second) * unit
    assert plan_stands(expression, zone, tick, later, keep, walked)[0] == kept(tick, later)
    assert plan_stands(expression, zone, tick, later, keep, None)[0] == kept(tick, later)


# ------------------------------------------------------------------------------------- planning per kind


def test_initial_planned_per_schedule_kind() -> None:
    enabled = utc(2026, 1, 1, 12, 0, 7)
    assert initial_planned(AtSchedule(utc(2020, 1, 1)), enabled) == utc(2020, 1, 1)  # past: due at once
    assert initial_planned(AtSchedule(utc(2030, 1, 1)), enabled) == utc(2030, 1, 1)
    assert initial_planned(EverySchedule(5 * MINUTE), enabled) == enabled + 5 * MINUTE
    future_start = EverySchedule(HOUR, starting_at_ns=utc(2026, 2, 1))
    assert initial_planned(future_start, enabled) == utc(2026, 2, 1)  # STARTING AT itself
    exact_start = EverySchedule(HOUR, starting_at_ns=enabled)
    assert initial_planned(exact_start, enabled) == enabled + HOUR  # strictly after the enable time
    past_start = EverySchedule(HOUR, starting_at_ns=utc(2025, 1, 1))
    assert initial_planned(past_start, enabled) == utc(2026, 1, 1, 13)  # next grid point after enabling
    assert initial_planned(CronSchedule("0 3 * * *", "Europe/Berlin"), enabled) == utc(2026, 1, 2, 2)


def test_next_planned_after_per_schedule_kind() -> None:
    anchor = utc(2026, 1, 1)
    every = EverySchedule(10 * MINUTE)
    assert next_planned_after(every, anchor, anchor + 10 * MINUTE) == anchor + 20 * MINUTE
    assert next_planned_after(every, anchor, anchor + 11 * MINUTE) == anchor + 20 * MINUTE
    started = EverySchedule(10 * MINUTE, starting_at_ns=anchor + 3 * MINUTE)
    assert next_planned_after(started, 0, anchor + 11 * MINUTE) == anchor + 13 * MINUTE  # STARTING AT wins
    at = AtSchedule(anchor)
    assert next_planned_after(at, 0, anchor - 1) == anchor
    assert next_planned_after(at, 0, anchor) is None  # it has run
    cron = CronSchedule("*/15 * * * *")
    assert next_planned_after(cron, 0, anchor + MINUTE) == anchor + 15 * MINUTE
