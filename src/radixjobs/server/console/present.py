"""Turning rows into what the pages show: outcome classes, SVG chart geometry, and time in the words the CLI
uses too (radixjobs.timewords: instants, durations, schedules in words).

Pure functions of their arguments (no I/O). Charts are drawn by the templates from the shapes built
here, so the page needs no script to show them and the browser fetches nothing else.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Sequence
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


def lateness_chart(recent: Iterable[dict[str, Any]], now: dt.datetime, width: int = 600, height: int = 120,
                   buckets: int = 12) -> dict[str, Any]:
    """p50/p99 lateness of first attempts per 5-minute bucket of the last hour, as SVG polylines."""
    span = 3600 / buckets
    groups: list[list[float]] = [[] for _ in range(buckets)]
    for row in recent:
        if row["attempt"] != 1 or row["lateness_s"] is None:
            continue
        age = (now - row["started_at"]).total_seconds()
        index = buckets - 1 - int(age // span)
        if 0 <= index < buckets:
            groups[index].append(max(0.0, float(row["lateness_s"])))
    p50 = [percentile(g, 0.5) for g in groups]
    p99 = [percentile(g, 0.99) for g in groups]
    top = max([v for v in p99 if v is not None] or [0.0]) or 1.0
    step = width / (buckets - 1)

    def points(series: list[float | None]) -> str:
        return " ".join(f"{i * step:.1f},{height - v / top * (height - 10):.1f}"
                        for i, v in enumerate(series) if v is not None)

    every = [v for g in groups for v in g]
    return {"width": width, "height": height, "p50": points(p50), "p99": points(p99), "top": seconds(top),
            "p50_all": seconds(percentile(every, 0.5)), "p99_all": seconds(percentile(every, 0.99)),
            "samples": len(every)}


def timeline(rows: Sequence[dict[str, Any]], now: dt.datetime, window_s: int, width: int = 900,
             height: int = 160) -> dict[str, Any]:
    """Attempts of a window as SVG shapes: a bar per attempt from its start for its duration (top band,
    one lane per attempt number), and its lateness as a dot (bottom band)."""
    start = now - dt.timedelta(seconds=window_s)
    scale = width / window_s
    band = height * 0.55
    late_top = max([float(r["lateness_s"] or 0) for r in rows] or [0.0]) or 1.0
    bars, dots = [], []
    for row in rows:
        x = (row["started_at"] - start).total_seconds() * scale
        if x < 0 or x > width:
            continue
        finished = row["finished_at"] or now
        w = max(2.0, (finished - row["started_at"]).total_seconds() * scale)
        lane = min(3, max(0, int(row["attempt"] or 1) - 1))
        title = (f"{iso(row['started_at'])} attempt {row['attempt']} {row['status']} "
                 f"took {seconds(row['duration_s'])}, late {seconds(row['lateness_s'])}")
        bars.append({"x": f"{x:.1f}", "y": f"{8 + lane * 18}", "w": f"{min(w, width - x):.1f}",
                     "cls": outcome_class(row["status"]), "title": title})
        lateness = max(0.0, float(row["lateness_s"] or 0))
        dots.append({"x": f"{x:.1f}", "y": f"{height - 4 - lateness / late_top * (height - band - 12):.1f}",
                     "cls": outcome_class(row["status"]), "title": title})
    ticks = [{"x": f"{i * width / 6:.1f}", "at": iso(start + dt.timedelta(seconds=i * window_s / 6))}
             for i in range(7)]
    return {"width": width, "height": height, "band": f"{band:.1f}", "bars": bars, "dots": dots,
            "ticks": ticks, "late_top": seconds(late_top)}


def dependency_graph(job: dict[str, Any], width: int = 600, row_h: int = 28) -> dict[str, Any] | None:
    """The jobs ``job`` runs after (left column) and that run after it (right), each a box joined to the
    job's box (middle) by a line labelled with its condition; None when it has neither. A job the reader
    does not see is a box without a link (radix.job_overview names it "(hidden)")."""
    ups, downs = job.get("upstreams") or [], job.get("downstreams") or []
    if not ups and not downs:
        return None
    rows = max(len(ups), len(downs), 1)
    height = rows * row_h + 8
    box_w, mid_y = width * 0.3, height / 2

    def column(edges: list[dict[str, Any]], x: float) -> list[dict[str, Any]]:
        top = (height - len(edges) * row_h) / 2
        return [{"x": f"{x:.1f}", "y": f"{top + i * row_h + 4:.1f}", "cy": f"{top + i * row_h + row_h / 2:.1f}",
                 "name": e["job"], "id": e.get("job_id"), "on": e["on"]} for i, e in enumerate(edges)]

    return {"width": width, "height": f"{height:.0f}", "box_w": f"{box_w:.1f}", "box_h": row_h - 8,
            "mid_x": f"{width * 0.35:.1f}", "mid_y": f"{mid_y - (row_h - 8) / 2:.1f}", "mid_cy": f"{mid_y:.1f}",
            "left_end": f"{box_w:.1f}", "mid_start": f"{width * 0.35:.1f}",
            "mid_end": f"{width * 0.65:.1f}", "right_start": f"{width * 0.7:.1f}",
            "ups": column(ups, 0), "downs": column(downs, width * 0.7)}
