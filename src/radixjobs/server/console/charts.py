"""The geometry of the console's SVG charts: the overview's lateness, a job's timeline and its dependencies.

Pure functions of their arguments (no I/O); the templates draw the shapes built here, so a page needs no
script to show them.

Invariants:
- Horizontal positions are percentages of the chart's width (``"12.5%"``) and text is in CSS pixels: a
  chart fills any width, a phone's or a desktop's, and its labels keep their size instead of shrinking
  with it. The timeline's vertical positions are percentages too (its height is the stylesheet's, taller
  relative to its width on a phone); the dependency graph's rows are fixed pixels.
- The timeline's axis ticks are evenly spaced at round times (multiples of a step from ``TICK_STEPS``),
  at most ``MAX_TICKS`` of them.
- A series of one point still shows: every value of a line chart is drawn as a dot as well.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from typing import Any

from radixjobs.server.console.present import iso, outcome_class, percentile, seconds

MINUTE, HOUR, DAY = 60, 3600, 86_400
TICK_STEPS = (1, 2, 5, 10, 15, 30, MINUTE, 2 * MINUTE, 5 * MINUTE, 10 * MINUTE, 15 * MINUTE, 30 * MINUTE,
              HOUR, 2 * HOUR, 3 * HOUR, 4 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 7 * DAY)
MAX_TICKS = 7


def pct(value: float) -> str:
    return f"{value:.2f}%"


def lateness_chart(recent: Iterable[dict[str, Any]], now: dt.datetime, buckets: int = 12) -> dict[str, Any]:
    """p50/p99 lateness of first attempts per 5-minute bucket of the last hour: lines (``p50``, ``p99``,
    points of a 1000×100 box the template stretches) and a dot per value (``dots``, in percentages)."""
    span = 3600 / buckets
    groups: list[list[float]] = [[] for _ in range(buckets)]
    for row in recent:
        if row["attempt"] != 1 or row["lateness_s"] is None:
            continue
        index = buckets - 1 - int((now - row["started_at"]).total_seconds() // span)
        if 0 <= index < buckets:
            groups[index].append(max(0.0, float(row["lateness_s"])))
    series = {"p50": [percentile(g, 0.5) for g in groups], "p99": [percentile(g, 0.99) for g in groups]}
    top = max([v for v in series["p99"] if v is not None] or [0.0]) or 1.0

    def place(i: int, v: float) -> tuple[float, float]:  # in the 1000×100 box, 2% kept free at each end
        return 20 + i * 960 / (buckets - 1), 100 - v / top * 92

    lines = {name: " ".join("{:.1f},{:.1f}".format(*place(i, v)) for i, v in enumerate(values) if v is not None)
             for name, values in series.items()}
    dots = [{"x": pct(x / 10), "y": pct(8 + y * 0.8), "cls": name, "title": f"{name} {seconds(v)}"}
            for name, values in series.items() for i, v in enumerate(values) if v is not None
            for x, y in [place(i, v)]]
    every = [v for g in groups for v in g]
    return {**lines, "dots": dots, "top": seconds(top), "p50_all": seconds(percentile(every, 0.5)),
            "p99_all": seconds(percentile(every, 0.99)), "samples": len(every)}


def ticks(start: dt.datetime, window_s: float) -> list[dict[str, Any]]:
    """Evenly spaced round times in ``[start, start + window_s]``: each with its place (a percentage), its
    time, whether it is a day (label: the date) and ``minor`` for every other one (a phone hides those)."""
    step = next((s for s in TICK_STEPS if window_s / s <= MAX_TICKS), TICK_STEPS[-1])
    begin = start.timestamp()
    first = math.ceil(begin / step) * step
    out = []
    for i in range(MAX_TICKS + 1):
        at = first + i * step
        if at > begin + window_s:
            break
        offset = (at - begin) / window_s * 100
        out.append({"x": pct(offset), "at": iso(dt.datetime.fromtimestamp(at, dt.UTC)), "day": step >= DAY,
                    "minor": i % 2 == 1, "anchor": "start" if offset < 4 else "end" if offset > 96 else "mid"})
    return out


def timeline(rows: Sequence[dict[str, Any]], now: dt.datetime, window_s: int) -> dict[str, Any]:
    """Attempts of a window: a bar per attempt from its start for its duration (top band, one lane per
    attempt number up to 4) and its lateness as a dot (bottom band); all positions in percentages."""
    start = now - dt.timedelta(seconds=window_s)
    late_top = max([float(r["lateness_s"] or 0) for r in rows] or [0.0]) or 1.0
    bars, dots = [], []
    for row in rows:
        x = (row["started_at"] - start).total_seconds() / window_s * 100
        if not 0 <= x <= 100:
            continue
        took = ((row["finished_at"] or now) - row["started_at"]).total_seconds() / window_s * 100
        lane = min(3, max(0, int(row["attempt"] or 1) - 1))
        title = (f"{iso(row['started_at'])} attempt {row['attempt']} {row['status']} "
                 f"took {seconds(row['duration_s'])}, late {seconds(row['lateness_s'])}")
        cls = outcome_class(row["status"])
        bars.append({"x": pct(x), "y": pct(4 + lane * 12), "w": pct(min(max(0.2, took), 100 - x)), "cls": cls,
                     "title": title})
        lateness = max(0.0, float(row["lateness_s"] or 0))
        dots.append({"x": pct(x), "y": pct(86 - lateness / late_top * 26), "cls": cls, "title": title})
    return {"bars": bars, "dots": dots, "ticks": ticks(start, window_s), "late_top": seconds(late_top)}


def dependency_graph(job: dict[str, Any]) -> dict[str, Any] | None:
    """The jobs ``job`` runs after and the jobs that run after it, twice: ``wide`` (three columns, the
    job in the middle) and ``tall`` (one column, a phone's); None when it has neither. A job the reader
    does not see is a box without a link (radix.job_overview names it "(hidden)")."""
    ups, downs = job.get("upstreams") or [], job.get("downstreams") or []
    if not ups and not downs:
        return None
    return {"wide": _wide(job["name"], ups, downs), "tall": _tall(job["name"], ups, downs)}


ROW_H, BOX_H = 30, 22


def _box(x: float, w: float, top: float, text: str, edge: dict[str, Any] | None) -> dict[str, Any]:
    return {"x": pct(x), "w": pct(w), "y": f"{top:.0f}", "h": BOX_H, "cy": f"{top + BOX_H / 2:.0f}",
            "text": text if edge is None else f"{edge['job']} · {edge['on']}",
            "id": None if edge is None else edge.get("job_id"), "self": edge is None}


def _wide(name: str, ups: list[dict[str, Any]], downs: list[dict[str, Any]]) -> dict[str, Any]:
    height = max(len(ups), len(downs), 1) * ROW_H + 8

    def column(edges: list[dict[str, Any]], x: float) -> list[dict[str, Any]]:
        top = (height - len(edges) * ROW_H) / 2 + (ROW_H - BOX_H) / 2
        return [_box(x, 30, top + i * ROW_H, "", e) for i, e in enumerate(edges)]

    me = _box(35, 30, (height - BOX_H) / 2, name, None)
    left, right = column(ups, 0), column(downs, 70)
    lines = [{"x1": pct(30), "y1": b["cy"], "x2": pct(35), "y2": me["cy"]} for b in left]
    lines += [{"x1": pct(65), "y1": me["cy"], "x2": pct(70), "y2": b["cy"]} for b in right]
    return {"height": height, "boxes": [*left, me, *right], "lines": lines, "captions": []}


def _tall(name: str, ups: list[dict[str, Any]], downs: list[dict[str, Any]]) -> dict[str, Any]:
    boxes, captions, y = [], [], 4.0
    for caption, edges in (("runs after", ups), (None, None), ("then run", downs)):
        if edges is None:
            boxes.append(_box(6, 94, y, name, None))
            y += ROW_H
            continue
        if edges:
            captions.append({"x": pct(6), "y": f"{y + 14:.0f}", "text": caption})
            y += ROW_H * 0.7
        for edge in edges:
            boxes.append(_box(6, 94, y, "", edge))
            y += ROW_H
    ends = [b["cy"] for b in boxes]
    lines = [{"x1": pct(3), "y1": ends[0], "x2": pct(3), "y2": ends[-1]}]
    lines += [{"x1": pct(3), "y1": cy, "x2": pct(6), "y2": cy} for cy in ends]
    return {"height": f"{y:.0f}", "boxes": boxes, "lines": lines, "captions": captions}
