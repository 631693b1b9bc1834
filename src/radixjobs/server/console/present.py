"""Turning rows into what the pages show: outcome classes, times and schedules in the words the CLI uses too
(radixjobs.timewords: instants, durations, schedules in words).

Pure functions of their arguments (no I/O). The charts' geometry is charts.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from radixjobs.timewords import elapsed
from radixjobs.timewords import iso as iso
from radixjobs.timewords import relative as relative
from radixjobs.timewords import schedule_words as schedule_words

OUTCOME_CLASS = {"succeeded": "ok", "running": "run", "completed": "ok", "failed": "bad", "lease_lost": "bad",
                 "released": "warn", "retry": "warn", "skipped": "muted", "missed": "warn"}
seconds = elapsed  # a measured duration, as the CLI shows it: "340 ms", "1.2 s", "2 min 5 s"
WINDOWS = {"10m": 600, "1h": 3600, "6h": 6 * 3600, "24h": 86_400, "7d": 7 * 86_400}


def pretty(value: Any, indent: int | None = 2) -> str:
    """JSON for a person (the template escapes it like any text)."""
    return json.dumps(value, indent=indent, ensure_ascii=False, sort_keys=True, default=str)


def outcome_class(status: str | None) -> str:
    return OUTCOME_CLASS.get(status or "", "muted")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of ``values`` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
