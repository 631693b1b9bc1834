"""The figures of compare's minute workloads, from each scheduler's runs and the bodies' effects (pure).

A run is ``(job, planned, status)``: ``planned`` the epoch second of the due minute it was for (None when
outside the workload's window), ``status`` as the scheduler's own history says it, ``succeeded`` for a
run whose body committed. An effect is ``(job, started, finished)``: what a body recorded
(``clock_timestamp()`` first and last). A job's runs never overlap in either scheduler here, and a
succeeded run commits exactly one effect, so a job's succeeded runs, in planned order, and its effects,
in start order, pair one to one.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from itertools import pairwise
from typing import Any

Run = tuple[int, float | None, str]
Effect = tuple[int, float, float]
FINAL = frozenset({"succeeded", "failed", "missed", "lease_lost"})


def by_order(rows: list[tuple[int, str]], due: list[float]) -> list[Run]:
    """pg_cron's runs of each job, in the order it wrote them (runid), as runs of its due minutes: pg_cron
    runs a job's due minutes one after another, in order, one row each (a failed start included), so the
    k-th row of a job is for its k-th due minute; rows past the window get None."""
    seen: Counter[int] = Counter()
    runs: list[Run] = []
    for job, status in rows:
        k = seen[job]
        seen[job] += 1
        runs.append((job, due[k] if k < len(due) else None, status))
    return runs


def by_start(rows: list[tuple[int, float, str]], due: list[float]) -> list[Run]:
    """pgAgent's runs (job, start, status) as runs of due minutes: pgAgent starts a job at a poll after its
    next run time, and computes the next one when a run ends, from that instant (a minute due meanwhile is
    skipped), so a run is for the last due minute at or before its start that no earlier run of its job
    took; None when there is none."""
    last: dict[int, float] = {}
    runs: list[Run] = []
    for job, start, status in sorted(rows, key=lambda r: (r[0], r[1])):
        candidates = [d for d in due if d <= start and d > last.get(job, -math.inf)]
        planned = candidates[-1] if candidates else None
        if planned is not None:
            last[job] = planned
        runs.append((job, planned, status))
    return runs


def settled_by_order(runs: list[Run], jobs: int, due: list[float]) -> bool:
    """Every job has a final run for each due minute (runs as ``by_order`` makes them)."""
    done = {(job, planned) for job, planned, status in runs if planned is not None and status in FINAL}
    return all((job, planned) in done for job in range(jobs) for planned in due)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def peak_concurrency(effects: list[Effect]) -> int:
    """The most bodies running at one instant."""
    events = sorted([(started, 1) for _, started, _ in effects] + [(finished, -1) for _, _, finished in effects])
    peak = running = 0
    for _, step in events:  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


def overlaps(effects: list[Effect]) -> int:
    """Runs of a job that started before its previous run had finished."""
    per_job: dict[int, list[Effect]] = defaultdict(list)
    for effect in effects:
        per_job[effect[0]].append(effect)
    count = 0
    for mine in per_job.values():
        mine.sort(key=lambda e: e[1])
        count += sum(1 for before, after in pairwise(mine) if after[1] < before[2])
    return count


def analyse(jobs: int, due: list[float], runs: list[Run], effects: list[Effect]) -> dict[str, Any]:
    """Lateness (body start − due minute) of the runs of the window's due minutes, start failures, missed
    minutes, overlaps and the peak of bodies at once."""
    in_window = set(due)
    succeeded: dict[int, list[float | None]] = defaultdict(list)
    for job, planned, status in sorted(runs, key=lambda r: (r[0], math.inf if r[1] is None else r[1])):
        if status == "succeeded":
            succeeded[job].append(planned)
    starts: dict[int, list[float]] = defaultdict(list)
    for job, started, _ in sorted(effects, key=lambda e: (e[0], e[1])):
        starts[job].append(started)
    late = [(started - planned) * 1000 for job, plans in succeeded.items()
            for planned, started in zip(plans, starts[job], strict=False) if planned in in_window]
    window_runs = [(job, planned, status) for job, planned, status in runs if planned in in_window]
    failures = Counter(status for _, _, status in window_runs if status in FINAL and status != "succeeded")
    ran = {(job, planned) for job, planned, _ in window_runs}
    result: dict[str, Any] = {
        "due_runs": jobs * len(due), "runs_started": len(window_runs), "runs_succeeded": len(late),
        "start_failures": sum(failures.values()), "failures_by_status": dict(failures),
        "unfinished": sum(1 for _, _, status in window_runs if status not in FINAL),
        "missed_minutes": jobs * len(due) - len(ran), "overlaps": overlaps(effects),
        "peak_running": peak_concurrency(effects)}
    if late:
        result |= {"lateness_p50_ms": round(percentile(late, 0.50), 1),
                   "lateness_p99_ms": round(percentile(late, 0.99), 1), "lateness_max_ms": round(max(late), 1)}
    return result
