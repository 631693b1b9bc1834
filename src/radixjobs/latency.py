"""Latency histograms, pure Python: the claim round trip, and an attempt from its start to its
finalisation, by outcome. /metrics exports them (server/http.py); radixjobs.telemetry records the same two
measures as OpenTelemetry histograms with the same bucket bounds.

Invariants:
- one set of bounds (``LATENCY_BUCKETS_S``) for Prometheus and OpenTelemetry, so both report the same buckets;
- the outcomes are a fixed set (``ATTEMPT_OUTCOMES``): a histogram's labels never grow with jobs or errors;
- nothing here imports any other radixjobs module: the engine's observer (radixjobs.observe) and the
  OpenTelemetry twin (radixjobs.telemetry) both read it, and neither imports the other to do so.
"""

from __future__ import annotations

import bisect
from typing import Final

# Seconds; the same boundaries for Prometheus and OpenTelemetry.
LATENCY_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                            60.0, 300.0, 1800.0)
ATTEMPT_OUTCOMES: Final = ("succeeded", "retrying", "failed")


def attempt_outcome(result: str) -> str:
    """succeeded / retrying / failed, from the engine's result (``failed:data``, …)."""
    return result.partition(":")[0]


class Histogram:
    """Counts of observations per bucket (upper bounds ``LATENCY_BUCKETS_S``), their sum and number."""

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_S):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) per bucket, the last bound infinite."""
        out, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


class Latencies:
    """The daemon's latency histograms (one set for all its databases: labels stay bounded)."""

    def __init__(self) -> None:
        self.claims = Histogram()
        self.attempts = {outcome: Histogram() for outcome in ATTEMPT_OUTCOMES}
