"""Schedule arithmetic: intervals, timestamps, cron ticks and the interval grid — pure, all in UTC ns.

Every instant is an ``int`` of nanoseconds since the Unix epoch (UTC); every duration an ``int`` of
nanoseconds. Nothing here reads a clock: callers pass "now" in.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from zoneinfo import ZoneInfo, available_timezones

from croniter import CroniterBadDateError, CroniterError, croniter

from radixjobs import wallclock
from radixjobs.errors import ScheduleError
from radixjobs.model import AfterSchedule, AtSchedule, CronSchedule, EverySchedule, Schedule

NS_PER_SECOND = 1_000_000_000
NS_PER_DAY = 86_400 * NS_PER_SECOND
MAX_INTERVAL_NS = 36_525 * NS_PER_DAY  # 100 years of 365.25 days
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# ---------------------------------------------------------------------------------------------- intervals

_UNIT_NS: dict[str, int] = {}
for _names, _ns in (
    (("us", "usec", "usecs", "microsecond", "microseconds"), 1_000),
    (("ms", "msec", "msecs", "millisecond", "milliseconds"), 1_000_000),
    (("s", "sec", "secs", "second", "seconds"), NS_PER_SECOND),
    (("m", "min", "mins", "minute", "minutes"), 60 * NS_PER_SECOND),
    (("h", "hr", "hrs", "hour", "hours"), 3_600 * NS_PER_SECOND),
    (("d", "day", "days"), NS_PER_DAY),
    (("w", "wk", "wks", "week", "weeks"), 7 * NS_PER_DAY),
):
    _UNIT_NS.update(dict.fromkeys(_names, _ns))

_CALENDAR_UNITS = frozenset(
    (
        "month",
        "months",
        "mon",
        "mons",
        "year",
        "years",
        "yr",
        "yrs",
        "y",
        "decade",
        "decades",
        "dec",
        "decs",
        "century",
        "centuries",
        "cent",
        "c",
        "millennium",
        "millennia",
        "millenniums",
        "mil",
        "mils",
    )
)

_INTERVAL_PART = re.compile(
    r"""\s*(?:
        (?P<time>[+-]?\d+:\d{1,2}(?::\d{1,2}(?:\.\d+)?)?(?![\d:.]))
      | (?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<unit>[a-z]+)?
      | (?P<word>[a-z]+)
      | (?P<junk>\S+)
    )""",
    re.VERBOSE | re.ASCII,
)


def _shown(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_interval(text: str) -> int:
    """Parse a fixed-length interval ('5 minutes', '1h30m', '1 day 02:00:00') to a positive ns count."""
    source = text.strip().lower()
    if not source:
        raise ScheduleError("interval is empty: give a number and a unit, e.g. '5 minutes'")
    total = Fraction(0)
    for part in _INTERVAL_PART.finditer(source):
        total += _interval_part_ns(part)
    if total <= 0:
        raise ScheduleError(f"interval must be positive, got '{_shown(text)}'")
    if total > MAX_INTERVAL_NS:
        raise ScheduleError(f"interval too large: '{_shown(text)}' is longer than 100 years")
    if total.denominator != 1:
        raise ScheduleError(f"interval '{_shown(text)}' is not a whole number of nanoseconds")
    return int(total)


def _interval_part_ns(part: re.Match[str]) -> Fraction:
    if part["time"] is not None:
        return _clock_ns(part["time"])
    if part["word"] is not None:
        word = part["word"]
        if word == "ago":
            raise ScheduleError("'ago' is not allowed in an interval: intervals must be positive")
        _unit_ns(word)  # a calendar or unknown unit gets its own message first
        raise ScheduleError(f"unit '{word}' has no number before it")
    if part["junk"] is not None:
        raise ScheduleError(f"unexpected '{_shown(part['junk'], 20)}' in interval")
    number, unit = part["num"], part["unit"]
    if unit is None:
        raise ScheduleError(
            f"missing unit after '{_shown(number, 20)}' in interval: use seconds, minutes, hours, days or weeks"
        )
    return Fraction(Decimal(number)) * _unit_ns(unit)


def _unit_ns(word: str) -> int:
    if word in _CALENDAR_UNITS:
        raise ScheduleError(f"calendar unit '{word}' is not allowed in an interval: use days or weeks")
    unit_ns = _UNIT_NS.get(word)
    if unit_ns is None:
        raise ScheduleError(f"unknown interval unit '{_shown(word, 20)}': use seconds, minutes, hours, days or weeks")
    return unit_ns


def _clock_ns(clock: str) -> Fraction:
    """'[-]HH:MM[:SS[.fraction]]' as ns; minutes and seconds must be below 60."""
    sign = -1 if clock.startswith("-") else 1
    fields = clock.lstrip("+-").split(":")
    hours, minutes = int(fields[0]), int(fields[1])
    seconds = Fraction(Decimal(fields[2])) if len(fields) == 3 else Fraction(0)
    if minutes >= 60 or seconds >= 60:
        raise ScheduleError(f"time field out of range in interval: '{clock}'")
    return sign * (hours * 3600 + minutes * 60 + seconds) * NS_PER_SECOND


# --------------------------------------------------------------------------------------------- timestamps

_TIMESTAMP = re.compile(
    r"""(?P<y>\d{4})-(?P<mo>\d{1,2})-(?P<d>\d{1,2})
        (?:(?:[Tt]|[ ]+)(?P<h>\d{1,2}):(?P<mi>\d{2})(?::(?P<s>\d{2})(?:[.,](?P<f>\d+))?)?)?
        [ ]*(?:(?P<z>[Zz])|(?P<sign>[+-])(?P<oh>\d{2})(?::?(?P<om>\d{2}))?)?""",
    re.VERBOSE | re.ASCII,
)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def parse_timestamp(text: str) -> int:
    """Parse an ISO-8601 timestamp to UTC ns since the epoch; no offset means UTC, a date alone midnight."""
    match = _TIMESTAMP.fullmatch(text.strip())
    if match is None:
        raise ScheduleError(
            f"invalid timestamp '{_shown(text)}': expected ISO-8601 such as '2026-01-31 03:00:00+01:00'"
        )
    try:
        day = date(int(match["y"]), int(match["mo"]), int(match["d"]))
    except ValueError:
        raise ScheduleError(f"date out of range in timestamp '{_shown(text)}'") from None
    hour, minute, second = (int(match[k] or 0) for k in ("h", "mi", "s"))
    if hour > 23 or minute > 59 or second > 59:
        raise ScheduleError(f"time out of range in timestamp '{_shown(text)}'")
    fraction = match["f"] or ""
    if len(fraction) > 9:
        raise ScheduleError(f"timestamp '{_shown(text)}' has more than 9 fractional digits")
    seconds = (day.toordinal() - _EPOCH_ORDINAL) * 86_400 + hour * 3_600 + minute * 60 + second
    seconds -= _offset_seconds(match, text)
    ns = seconds * NS_PER_SECOND + int(fraction.ljust(9, "0"))
    if not INT64_MIN <= ns <= INT64_MAX:
        raise ScheduleError(f"timestamp out of range: '{_shown(text)}' (years 1678 to 2261 are supported)")
    return ns


def _offset_seconds(match: re.Match[str], text: str) -> int:
    if match["sign"] is None:
        return 0
    hours, minutes = int(match["oh"]), int(match["om"] or 0)
    if hours > 23 or minutes > 59:
        raise ScheduleError(f"time zone offset out of range in timestamp '{_shown(text)}'")
    offset = hours * 3_600 + minutes * 60
    return -offset if match["sign"] == "-" else offset


# ------------------------------------------------------------------------------------------------- cron

_CRON_ALIASES = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})
_NONDETERMINISTIC_FIELD = re.compile(r"(?:^|,)[hr](?:$|[(/,])", re.IGNORECASE)
_MAX_CRON_CANDIDATES = 20_000  # a 1-second cron walking a 2-hour fall-back fold needs 7 200


@functools.cache
def _zone_names() -> frozenset[str]:
    # 'localtime' and 'posixrules' are host-specific links, not zones: a job must mean the same everywhere.
    return (frozenset(available_timezones()) | {"UTC"}) - {"localtime", "posixrules"}


def load_time_zone(name: str) -> ZoneInfo:
    """The IANA zone called ``name`` (not host aliases like 'localtime'); ScheduleError when there is none."""
    try:
        if name not in _zone_names():
            raise KeyError(name)
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError, TypeError):
        raise ScheduleError(f"unknown time zone '{_shown(name)}': use an IANA name such as 'Europe/Berlin'") from None


def validate_cron(expression: str, time_zone: str) -> None:
    """Raise ScheduleError unless ``expression`` is a usable cron expression and ``time_zone`` an IANA zone.

    Five fields ``min hour dom mon dow`` tick at whole minutes. Six fields put the seconds *first*:
    ``sec min hour dom mon dow`` (the DBOS / Quartz convention). The aliases @hourly, @daily, @midnight,
    @weekly, @monthly, @yearly and @annually are accepted; field semantics are croniter's (day of month and
    day of week OR-ed when both are restricted, as in Vixie cron). Random/hashed fields (R, H) are refused
    because ticks must be reproducible. An expression that can never fire (``0 0 31 2 *``) is refused.
    """
    load_time_zone(time_zone)
    _compile_cron(expression)
    next_cron_tick(expression, time_zone, 0)


def _compile_cron(expression: str) -> str:
    fields = expression.split()
    if len(fields) == 1 and fields[0].lower() in _CRON_ALIASES:
        return fields[0].lower()
    if len(fields) not in (5, 6):
        raise ScheduleError(
            f"cron expression '{_shown(expression)}' has {len(fields)} fields: use 5 "
            "(min hour dom mon dow) or 6 (sec min hour dom mon dow)"
        )
    if any(_NONDETERMINISTIC_FIELD.search(field) for field in fields):
        raise ScheduleError(
            f"cron expression '{_shown(expression)}': random and hashed fields (R, H) are not supported"
        )
    normalised = " ".join(fields)
    try:
        croniter.expand(normalised, second_at_beginning=True)
    except (CroniterError, ValueError, TypeError, OverflowError, IndexError, KeyError) as exc:
        detail = str(exc).splitlines()[-1] if str(exc) else type(exc).__name__
        message = f"invalid cron expression '{_shown(expression)}': {_shown(detail, 120)}"
        raise ScheduleError(message) from None
    return normalised


def next_cron_tick(expression: str, time_zone: str, after_ns: int) -> int:
    """The first instant strictly after ``after_ns`` at which the cron expression fires in ``time_zone``.

    Daylight saving time follows cronie's rule. A job at fixed times (its minute and hour fields do not start
    with '*') fires at each of them once per local day: a time skipped by a spring-forward jump fires at the
    first instant after the jump (several skipped times of one day fire there once), a time repeated at
    fall-back fires at its first occurrence only. A job with '*' first in its minute or hour field (``*/15 *
    * * *``, ``0 * * * *``, @hourly) fires by the wall clock: skipped times do not fire, repeated ones fire
    at each occurrence.
    """
    zone = load_time_zone(time_zone)
    normalised = _compile_cron(expression)
    after_s = after_ns // NS_PER_SECOND  # ticks are whole seconds: the next one is after this second
    try:
        if _fires_by_wall_clock(normalised):
            tick_s = _next_wall_clock_tick(normalised, zone, after_s)
        else:
            tick_s = _next_fixed_time_tick(normalised, zone, after_s)
    except CroniterBadDateError:
        raise ScheduleError(f"cron expression '{_shown(expression)}' never fires") from None
    except (CroniterError, ValueError, OverflowError, OSError) as exc:
        raise ScheduleError(f"cron expression '{_shown(expression)}' has no next tick: {exc}") from None
    if tick_s is None or tick_s * NS_PER_SECOND > INT64_MAX:
        raise ScheduleError(f"cron expression '{_shown(expression)}' has no next tick in the supported range")
    return tick_s * NS_PER_SECOND


def _fires_by_wall_clock(normalised: str) -> bool:
    """cronie's wildcard jobs: '*' first in the minute or the hour field (@hourly is ``0 * * * *``)."""
    if normalised.startswith("@"):
        return normalised == "@hourly"
    fields = normalised.split()
    minute, hour = fields[-5], fields[-4]
    return minute.startswith("*") or hour.startswith("*")


def _local_ticks(normalised: str, start: datetime) -> Iterator[datetime]:
    """The expression's naive local times strictly after ``start``, bounded in number."""
    ticks = croniter(normalised, start, ret_type=datetime, second_at_beginning=True)
    for _ in range(_MAX_CRON_CANDIDATES):
        local: datetime = ticks.get_next(datetime)
        yield local


def _next_fixed_time_tick(normalised: str, zone: ZoneInfo, after_s: int) -> int | None:
    # Each local time maps to its first occurrence, or to the end of its gap: a map that never goes back,
    # so the first local time after the present one whose instant is after ``after_s`` is the answer.
    for local in _local_ticks(normalised, wallclock.local_time(after_s, zone)):
        instants = wallclock.occurrences(local, zone)
        tick = instants[0] if instants else wallclock.gap_end(local, zone)
        if tick > after_s:
            return tick
    return None


def _next_wall_clock_tick(normalised: str, zone: ZoneInfo, after_s: int) -> int | None:
    # Wall times after the present one come in order, each at its earliest occurrence still ahead; only a
    # fall-back ahead brings earlier wall times back, and those come in order again from the fall-back.
    tick = _first_occurrence_after(normalised, zone, wallclock.local_time(after_s, zone), after_s)
    fall_back = wallclock.fall_back_ahead(after_s, zone)
    if fall_back is not None:  # from there the wall clock shows earlier times again, each a second time
        start = wallclock.local_time(fall_back, zone) - timedelta(seconds=1)
        again = _first_occurrence_after(normalised, zone, start, fall_back - 1)
        if again is not None and (tick is None or again < tick):
            tick = again
    return tick


def _first_occurrence_after(normalised: str, zone: ZoneInfo, start: datetime, after_s: int) -> int | None:
    """The earliest occurrence after ``after_s`` of the first local time after ``start`` that has one."""
    for local in _local_ticks(normalised, start):
        later = [t for t in wallclock.occurrences(local, zone) if t > after_s]
        if later:
            return later[0]
    return None


# ---------------------------------------------------------------------------------------------- the grid


def _check_interval(interval_ns: int) -> None:
    if interval_ns <= 0:
        raise ScheduleError(f"interval must be positive, got {interval_ns} ns")


def first_tick_after(anchor_ns: int, interval_ns: int, after_ns: int) -> int:
    """Smallest grid point ``anchor + k*interval`` (k >= 0) strictly greater than ``after_ns``."""
    _check_interval(interval_ns)
    if after_ns < anchor_ns:
        return anchor_ns
    return anchor_ns + ((after_ns - anchor_ns) // interval_ns + 1) * interval_ns


def coalesce(anchor_ns: int, interval_ns: int, planned_ns: int, now_ns: int) -> tuple[int, int]:
    """(tick to run, ticks skipped): missed ticks collapse to the latest grid tick <= now.

    When ``planned_ns`` is still in the future, or no grid tick lies between it and now, the planned tick
    is kept and nothing is skipped. Otherwise every tick from ``planned_ns`` (included) to the latest
    grid tick (excluded) counts as skipped.
    """
    _check_interval(interval_ns)
    if planned_ns > now_ns:
        return planned_ns, 0
    latest = anchor_ns + ((now_ns - anchor_ns) // interval_ns) * interval_ns
    if latest <= planned_ns:
        return planned_ns, 0
    grid_between = (latest - 1 - anchor_ns) // interval_ns - (planned_ns - anchor_ns) // interval_ns
    return latest, grid_between + 1  # the planned tick itself, then the grid ticks before ``latest``


def initial_planned(schedule: Schedule, enabled_at_ns: int) -> int:
    """The first planned tick of a job enabled at ``enabled_at_ns``.

    AT: its instant, even when already past (it is then due at once). EVERY: the first grid point strictly
    after the enable time — STARTING AT itself when it is later, never a tick from before the job was
    enabled. CRON: the first tick after the enable time.
    """
    if isinstance(schedule, AtSchedule):
        return schedule.at_ns
    if isinstance(schedule, AfterSchedule):
        raise ScheduleError("an AFTER schedule has no ticks of its own: its upstreams' ticks queue them")
    return _next_tick(schedule, enabled_at_ns, enabled_at_ns)


def next_planned_after(schedule: Schedule, anchor_ns: int, after_ns: int) -> int | None:
    """The next planned tick strictly after ``after_ns``; None when the schedule has no more ticks.

    EVERY ticks on its grid: STARTING AT + k*interval (k >= 0) if set, else ``anchor_ns`` (the time the
    job was armed) + k*interval with k >= 1; AT has one tick, returned only while it is still after
    ``after_ns``; CRON gives its next tick; AFTER has no ticks of its own (its upstreams' ends queue them).
    """
    if isinstance(schedule, AtSchedule):
        return schedule.at_ns if schedule.at_ns > after_ns else None
    if isinstance(schedule, AfterSchedule):
        return None
    return _next_tick(schedule, anchor_ns, after_ns)


def _next_tick(schedule: EverySchedule | CronSchedule, armed_at_ns: int, after_ns: int) -> int:
    """The tick strictly after ``after_ns`` of a recurring schedule armed at ``armed_at_ns``."""
    if isinstance(schedule, CronSchedule):
        return next_cron_tick(schedule.expression, schedule.time_zone, after_ns)
    if schedule.starting_at_ns is None:  # the arming instant is the grid's origin, not a tick
        return first_tick_after(armed_at_ns, schedule.interval_ns, max(armed_at_ns, after_ns))
    return first_tick_after(schedule.starting_at_ns, schedule.interval_ns, after_ns)


__all__ = [
    "MAX_INTERVAL_NS",
    "NS_PER_DAY",
    "NS_PER_SECOND",
    "coalesce",
    "first_tick_after",
    "initial_planned",
    "load_time_zone",
    "next_cron_tick",
    "next_planned_after",
    "parse_interval",
    "parse_timestamp",
    "validate_cron",
]
