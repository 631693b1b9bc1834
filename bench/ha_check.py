"""The verdict of ``bench/run.py ha``, from what the old leader showed as committed before each event and
what the final leader holds after the daemons stopped.

Invariants checked (each must be 0): an atomic effect twice (the effects table has no unique key, so a
duplicate is counted, not refused); an effect or a succeeded attempt seen committed on a leader before an
event and missing at the end (lost); an atomic success without its effect, or an atomic effect without its
success; a ``radix.once()`` effect twice; a chain tick whose first link succeeded and whose last did not; a
non-atomic tick begun (a step committed) and never finished although none of its attempts failed for good
(at least once: a tick cut off runs again as itself). The non-atomic jobs' other observations (attempts cut
off, steps repeated, the errors their attempts saw) are figures, not violations.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg

ATOMIC_JOBS = ("atomic1", "atomic2", "atomic3", "chain_a", "chain_b", "chain_c")
NON_ATOMIC_JOBS = ("steps1", "steps2")
CHAIN = ("chain_a", "chain_b", "chain_c")

EFFECTS = "SELECT id, key, job, step, extract(epoch FROM at)::float8 FROM ha.effects"
HISTORY = """
SELECT h.history_id, h.idempotency_key, j.job_name, h.status, extract(epoch FROM h.started_at)::float8,
       extract(epoch FROM h.finished_at)::float8, h.planned_ns,
       concat_ws(' ', h.error->>'sqlstate', h.error->>'reason', left(h.error->>'message', 90))
FROM radix.radix_system_job_history h JOIN radix.jobs j USING (job_id)
WHERE j.schema_name = 'ha'
"""


@dataclass
class Snapshot:
    """Effects (id, key, job, step, at) and history (id, key, job, status, started, finished, planned, error)
    as one leader showed them, in one transaction."""

    effects: list[tuple[Any, ...]] = field(default_factory=list)
    history: list[tuple[Any, ...]] = field(default_factory=list)

    def effect_ids(self) -> set[int]:
        return {row[0] for row in self.effects}

    def succeeded_ids(self) -> set[int]:
        return {row[0] for row in self.history if row[3] == "succeeded"}

    def running(self, jobs: tuple[str, ...]) -> list[tuple[Any, ...]]:
        return [row for row in self.history if row[3] == "running" and row[2] in jobs]


def snapshot(conn: psycopg.Connection[Any]) -> Snapshot:
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return Snapshot(conn.execute(EFFECTS).fetchall(), conn.execute(HISTORY).fetchall())


def _window(at: float | None, bounds: list[float]) -> int | None:
    """The event whose window [start of event i, start of event i+1) holds ``at``; None before the first."""
    if at is None or at < bounds[0]:
        return None
    return sum(1 for start in bounds if at >= start) - 1


def duplicates(final: Snapshot, bounds: list[float]) -> tuple[int, Counter[int | None]]:
    """Atomic effects beyond the first for their key: in total, and by the window of the extra row."""
    rows: defaultdict[str, list[float]] = defaultdict(list)
    for _, key, job, _, at in final.effects:
        if job in ATOMIC_JOBS:
            rows[key].append(at)
    per_window: Counter[int | None] = Counter()
    for times in rows.values():
        for at in sorted(times)[1:]:
            per_window[_window(at, bounds)] += 1
    return sum(per_window.values()), per_window


def lost(before: Snapshot, final: Snapshot) -> dict[str, int]:
    """What a leader showed as committed before an event and the final leader does not have."""
    return {"effects": len(before.effect_ids() - final.effect_ids()),
            "succeeded_attempts": len(before.succeeded_ids() - final.succeeded_ids())}


def history_matches_effects(final: Snapshot) -> dict[str, int]:
    """Atomic jobs: every success has its effect and every effect its success (same idempotency key)."""
    succeeded = {row[1] for row in final.history if row[3] == "succeeded" and row[2] in ATOMIC_JOBS}
    effects = {row[1] for row in final.effects if row[2] in ATOMIC_JOBS}
    once = Counter(row[1] for row in final.effects if row[2] in NON_ATOMIC_JOBS and row[3] == 2)
    return {"atomic_successes_without_effect": len(succeeded - effects),
            "atomic_effects_without_success": len(effects - succeeded),
            "once_effects_twice": sum(n - 1 for n in once.values() if n > 1)}


def _statuses(final: Snapshot) -> defaultdict[str, list[str]]:
    """Each idempotency key's attempts, by status, in the order they started."""
    statuses: defaultdict[str, list[str]] = defaultdict(list)
    for row in sorted(final.history, key=lambda r: r[4]):
        statuses[row[1]].append(row[3])
    return statuses


def non_atomic(final: Snapshot, bounds: list[float]) -> list[dict[str, Any]]:
    """Per event window, what the non-atomic jobs' ticks saw: attempts by status, the errors, ticks whose
    steps ran more than once (a cut-off attempt run again), ticks never finished though no attempt failed for
    good (with their attempts)."""
    windows: list[dict[str, Any]] = [{"attempts": Counter(), "errors": Counter(), "ticks_rerun": 0,
                                      "ticks_unfinished": []} for _ in bounds]
    for _, _, job, status, started, _, _, error in final.history:
        index = _window(started, bounds)
        if job in NON_ATOMIC_JOBS and index is not None:
            windows[index]["attempts"][status] += 1
            if status != "succeeded" and error.strip():
                windows[index]["errors"][error.strip()] += 1
    steps: defaultdict[str, list[tuple[int, float]]] = defaultdict(list)
    for _, key, job, step, at in final.effects:
        if job in NON_ATOMIC_JOBS:
            steps[key].append((step, at))
    statuses = _statuses(final)
    for key, key_steps in steps.items():
        index = _window(min(at for _, at in key_steps), bounds)
        if index is None:
            continue
        windows[index]["ticks_rerun"] += sum(1 for step, _ in key_steps if step == 1) > 1
        if not any(step == 3 for step, _ in key_steps) and "failed" not in statuses[key]:
            windows[index]["ticks_unfinished"].append(
                f"steps {sorted(step for step, _ in key_steps)}, attempts {statuses[key] or 'none kept'}")
    return [{"attempts": dict(w["attempts"]), "errors": dict(w["errors"].most_common(4)),
             "ticks_rerun": w["ticks_rerun"], "ticks_unfinished": w["ticks_unfinished"]} for w in windows]


def chain(final: Snapshot, before: Snapshot, done_at: float) -> dict[str, Any]:
    """The chain a → b → c: ticks (planned times) complete through c, incomplete ones (the first link
    succeeded before ``done_at``, a moment the chain was idle, and the last did not), and the links in
    flight (visible as running) just before the event and how each ended."""
    done: defaultdict[str, Counter[int]] = defaultdict(Counter)
    for _, _, job, status, _, _, planned, _ in final.history:
        if job in CHAIN and status == "succeeded":
            done[job][planned] += 1
    first_done = {row[6] for row in final.history
                  if row[2] == "chain_a" and row[3] == "succeeded" and row[5] is not None and row[5] < done_at}
    in_flight, statuses = before.running(CHAIN), _statuses(final)
    return {"ticks_complete": sum(1 for p in done["chain_a"] if done["chain_c"][p] == 1),
            "ticks_incomplete": sum(1 for p in done["chain_a"] if p in first_done and done["chain_c"][p] != 1),
            "links_in_flight": [f"{row[2]}: {'succeeded once' if done[row[2]][row[6]] == 1 else 'not succeeded'}, "
                                f"attempts {statuses[row[1]]}" for row in in_flight]}
