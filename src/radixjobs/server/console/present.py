"""Turning rows into what the pages show: schedules in words, outcome classes, times, durations.

Pure functions of their arguments (no I/O). The charts' geometry is charts.py.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from typing import Any

UNITS = (("day", 86_400), ("hour", 3_600), ("minute", 60), ("second", 1))
OUTCOME_CLASS = {"succeeded": "ok", "running": "run", "completed": "ok", "failed": "bad", "lease_lost": "bad",
                 "released": "warn", "retry": "warn", "skipped": "muted", "missed": "warn"}
WINDOWS = {"10m": 600, "1h": 3600, "6h": 6 * 3600, "24h": 86_400, "7d": 7 * 86_400}


def pretty(value: Any, indent: int | None = 2) -> str:
    """JSON for a person (the template escapes it like any text)."""
    return json.dumps(value, indent=indent, ensure_ascii=False, sort_keys=True, default=str)


def outcome_class(status: str | None) -> str:
    return OUTCOME_CLASS.get(status or "", "muted")


def plural(n: float, unit: str) -> str:
    value = f"{n:g}"
    return f"{value} {unit}" if value == "1" else f"{value} {unit}s"


def duration_words(seconds: float) -> str:
    for unit, size in UNITS:
        if seconds >= size and seconds % size == 0:
            return plural(seconds / size, unit)
    return plural(round(seconds, 3), "second")


def schedule_words(row: dict[str, Any]) -> str:
    """A job's schedule as a person says it: "every 5 seconds", "once at …", "cron '0 * * * *' (UTC)"."""
    kind = row.get("schedule_kind")
    if kind == "every" and row.get("interval_ns"):
        return f"every {duration_words(row['interval_ns'] / 1e9)}".replace("every 1 ", "every ")
    if kind == "at" and row.get("at_ns") is not None:
        return f"once at {iso(dt.datetime.fromtimestamp(row['at_ns'] / 1e9, dt.UTC))}"
    if kind == "cron":
        return f"cron '{row.get('cron_expression')}' ({row.get('cron_time_zone') or 'UTC'})"
    if kind == "after":
        return "when the jobs it runs after end"
    if kind == "document":
        return f"document: {row.get('schedule_text') or 'once'}"
    return str(row.get("schedule_text") or row.get("schedule") or "")


def iso(value: dt.datetime | None) -> str:
    return "" if value is None else value.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def relative(value: dt.datetime | None, now: dt.datetime) -> str:
    """"in 4 s", "3 min ago": the server's first rendering (the page's script keeps it current)."""
    if value is None:
        return ""
    delta = (value - now).total_seconds()
    size = abs(delta)
    text = (f"{size:.0f} s" if size < 90 else f"{size / 60:.0f} min" if size < 5400
            else f"{size / 3600:.0f} h" if size < 172_800 else f"{size / 86_400:.0f} d")
    return f"in {text}" if delta >= 0 else f"{text} ago"


def seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.1f} s" if abs(value) < 120 else \
        f"{value / 60:.1f} min"


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of ``values`` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
