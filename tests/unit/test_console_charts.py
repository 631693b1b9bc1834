"""The console's chart geometry: lateness (a lone point shows), the timeline (round, evenly spaced ticks),
the dependency graph (wide and tall)."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from radixjobs.server.console import charts

NOW = dt.datetime(2026, 1, 1, 12, 0, 7, tzinfo=dt.UTC)


def _attempt(age_s: float, late_s: float, status: str = "succeeded", attempt: int = 1) -> dict[str, object]:
    started = NOW - dt.timedelta(seconds=age_s)
    return {"started_at": started, "finished_at": started + dt.timedelta(seconds=1), "attempt": attempt,
            "status": status, "duration_s": 1.0, "lateness_s": late_s}


def _pct(value: str) -> float:
    assert value.endswith("%")
    return float(value[:-1])


def test_lateness_chart_counts_first_attempts_of_the_last_hour() -> None:
    chart = charts.lateness_chart([_attempt(10, 0.5), _attempt(20, 1.5), _attempt(30, 9, attempt=2),
                                   _attempt(4000, 99)], NOW)
    assert chart["samples"] == 2
    assert chart["p99_all"] == "1.5 s"


def test_a_lone_bucket_is_drawn_as_dots() -> None:
    """One 5-minute bucket makes a line of one point, which draws nothing: its values are dots too."""
    chart = charts.lateness_chart([_attempt(10, 0.5)], NOW)
    assert len(chart["p50"].split()) == 1
    assert [d["cls"] for d in chart["dots"]] == ["p50", "p99"]
    assert all(0 < _pct(d["x"]) < 100 and 0 < _pct(d["y"]) < 100 for d in chart["dots"])
    assert charts.lateness_chart([], NOW)["dots"] == []


def test_timeline_places_attempts_in_the_window() -> None:
    chart = charts.timeline([_attempt(300, 0.1), _attempt(900, 0.1), _attempt(60, 2, "failed", 2)], NOW, 600)
    assert len(chart["bars"]) == 2  # the one 900 s ago is outside the 10-minute window
    assert {b["cls"] for b in chart["bars"]} == {"ok", "bad"}
    assert all(0 <= _pct(b["x"]) <= 100 and _pct(b["x"]) + _pct(b["w"]) <= 100.01 for b in chart["bars"])
    assert _pct(chart["bars"][0]["x"]) == pytest.approx(50, abs=0.01)


@pytest.mark.parametrize(("window_s", "step_s"), [(600, 120), (3600, 600), (6 * 3600, 3600), (86_400, 4 * 3600),
                                                  (7 * 86_400, 86_400)])
def test_ticks_are_round_times_evenly_spaced(window_s: int, step_s: int) -> None:
    start = NOW - dt.timedelta(seconds=window_s)
    ticks = charts.ticks(start, window_s)
    assert 3 <= len(ticks) <= charts.MAX_TICKS
    times = [dt.datetime.fromisoformat(t["at"]) for t in ticks]
    assert all(t.timestamp() % step_s == 0 for t in times)
    assert {(b - a).total_seconds() for a, b in itertools.pairwise(times)} == {step_s}
    places = [_pct(t["x"]) for t in ticks]
    gaps = {round(b - a, 1) for a, b in itertools.pairwise(places)}
    assert len(gaps) == 1  # evenly spaced on the axis too
    assert all(0 <= p <= 100 for p in places)
    assert [t["minor"] for t in ticks][:2] == [False, True]
    assert all(t["day"] == (step_s >= 86_400) for t in ticks)


def test_dependency_graph_wide_and_tall() -> None:
    job = {"name": "app.load", "upstreams": [{"job": "app.pull", "on": "succeeds", "job_id": "u1"},
                                             {"job": "(hidden)", "on": "fails"}],
           "downstreams": [{"job": "app.report", "on": "completes", "job_id": "d1"}]}
    graph = charts.dependency_graph(job)
    assert graph is not None
    for layout in (graph["wide"], graph["tall"]):
        texts = [b["text"] for b in layout["boxes"]]
        assert texts == ["app.pull · succeeds", "(hidden) · fails", "app.load", "app.report · completes"]
        assert [b["id"] for b in layout["boxes"]] == ["u1", None, None, "d1"]
        assert all(_pct(b["x"]) + _pct(b["w"]) <= 100 for b in layout["boxes"])
    assert len(graph["wide"]["lines"]) == 3  # one per edge
    assert [c["text"] for c in graph["tall"]["captions"]] == ["runs after", "then run"]
    assert charts.dependency_graph({"name": "x", "upstreams": [], "downstreams": []}) is None
