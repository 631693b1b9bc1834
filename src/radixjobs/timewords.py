"""One language for time, spoken by the CLI and the console alike: instants, configured intervals, measured
durations, relative times, and schedules in words.

Invariants:
- pure functions of their arguments: no I/O, no clock (``relative`` is given its ``now``);
- an instant is shown in UTC, marked ``Z``: ``2026-05-01 03:00:00Z`` for people, ``2026-05-01T03:00:00Z``
  (``iso``) where a machine reads it (an HTML ``datetime`` attribute);
- a configured interval (a schedule's, a timeout) is in words PostgreSQL reads back as the same interval
  (``1 day 30 minutes``, ``1.5 seconds``); a measured one (an attempt's duration, its lateness) is short
  (``340 ms``, ``1.2 s``, ``2 min 5 s``);
- a cron expression is put in words by cron-descriptor, never by hand, and never fails a page: an expression
  it cannot read is shown as itself. Its words never stand alone where the expression is not shown too.
"""

from __future__ import annotations

import datetime as dt
import functools
from decimal import Decimal
from typing import Any

NS_PER_SECOND = 1_000_000_000
_INTERVAL_UNITS = (("day", 86_400 * NS_PER_SECOND), ("hour", 3_600 * NS_PER_SECOND), ("minute", 60 * NS_PER_SECOND))
# The aliases validate_cron accepts (schedule.py), as the five fields cron-descriptor reads.
_CRON_ALIASES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
                 "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


def plural(count: int | Decimal | float, unit: str) -> str:
    """``1 minute``, ``2 minutes``, ``1.5 seconds``."""
    text = f"{count:f}" if isinstance(count, Decimal) else f"{count:g}"
    return f"{text} {unit}" if text == "1" else f"{text} {unit}s"


def interval_words(ns: int) -> str:
    """A configured interval: ``5 seconds``, ``1 day 30 minutes``, ``1.5 seconds``, ``250 milliseconds``."""
    parts: list[str] = []
    rest = int(ns)
    for unit, size in _INTERVAL_UNITS:
        count, rest = divmod(rest, size)
        if count:
            parts.append(plural(count, unit))
    if rest >= NS_PER_SECOND or (rest and parts):
        parts.append(plural((Decimal(rest) / NS_PER_SECOND).normalize(), "second"))
    elif rest:
        parts.append(plural((Decimal(rest) / 1_000_000).normalize(), "millisecond"))
    return " ".join(parts) or "0 seconds"


def elapsed(value: dt.timedelta | float | None) -> str:
    """A measured duration: ``340 ms``, ``1.2 s``, ``2 min 5 s``, ``3 h 12 min``, ``2 d 4 h`` ('' when
    unknown; negative with a minus, as a tick started early)."""
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    sign, size = ("-" if seconds < 0 else ""), abs(seconds)
    if size < 1:
        text = f"{size * 1000:.0f} ms"
    elif size < 60:
        text = f"{size:.1f}".removesuffix(".0") + " s"
    elif size < 3600:
        text = f"{int(size // 60)} min {int(size % 60)} s"
    elif size < 86_400:
        text = f"{int(size // 3600)} h {int(size % 3600 // 60)} min"
    else:
        text = f"{int(size // 86_400)} d {int(size % 86_400 // 3600)} h"
    return sign + text


def instant(value: dt.datetime | None, *, milliseconds: bool = False) -> str:
    """A point in time for people, in UTC: ``2026-05-01 03:00:00Z`` (with ``milliseconds``:
    ``…03:00:00.125Z``); '' when unknown."""
    if value is None:
        return ""
    spec = "milliseconds" if milliseconds else "seconds"
    return value.astimezone(dt.UTC).isoformat(sep=" ", timespec=spec).replace("+00:00", "Z")


def iso(value: dt.datetime | None) -> str:
    """A point in time for machines (RFC 3339, UTC, to the second): ``2026-05-01T03:00:00Z``."""
    return "" if value is None else value.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def relative(value: dt.datetime | None, now: dt.datetime) -> str:
    """``in 4 s``, ``3 min ago``, ``in 2 h``, ``5 d ago`` ('' when unknown)."""
    if value is None:
        return ""
    delta = (value - now).total_seconds()
    size = abs(delta)
    text = (f"{size:.0f} s" if size < 90 else f"{size / 60:.0f} min" if size < 5400
            else f"{size / 3600:.0f} h" if size < 172_800 else f"{size / 86_400:.0f} d")
    return f"in {text}" if delta >= 0 else f"{text} ago"


@functools.lru_cache(maxsize=512)
def cron_words(expression: str, time_zone: str = "UTC") -> str:
    """A cron expression in words, in its time zone: ``at 03:00, Monday through Friday (Europe/Berlin)``;
    the expression itself when cron-descriptor cannot read it."""
    from cron_descriptor import CasingTypeEnum, ExpressionDescriptor, Options

    fields = " ".join(expression.split())
    options = Options(CasingTypeEnum.Sentence, use_24hour_time_format=True, locale_code="en_US",
                      day_of_week_start_index_zero=True)
    try:
        words = str(ExpressionDescriptor(_CRON_ALIASES.get(fields.lower(), fields), options).get_description())
    except Exception:  # any failure of the wording: the expression stands for itself
        return f"cron '{expression}' ({time_zone})"
    return f"{words[:1].lower()}{words[1:]} ({time_zone})"


def schedule_words(row: dict[str, Any]) -> str:
    """A job's schedule (a row of radix.job_overview) as a person says it: ``every 5 seconds``, ``once at
    2026-05-01 03:00:00Z``, ``at 03:00 (UTC)``."""
    kind = row.get("schedule_kind")
    if kind == "every" and row.get("interval_ns"):
        return f"every {interval_words(int(row['interval_ns']))}".replace("every 1 ", "every ")
    if kind == "at" and row.get("at_ns") is not None:
        return f"once at {instant(dt.datetime.fromtimestamp(row['at_ns'] // NS_PER_SECOND, dt.UTC))}"
    if kind == "cron":
        return cron_words(str(row.get("cron_expression")), row.get("cron_time_zone") or "UTC")
    if kind == "after":
        return "when the jobs it runs after end"
    if kind == "document":
        return f"document: {row.get('schedule_text') or 'once'}"
    return str(row.get("schedule_text") or row.get("schedule") or "")
