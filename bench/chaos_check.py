"""The chaos run's verdict, from the effects tables, the ledger (every history row ever written) and the
engine's state after the clean stop.

Violations (each must be 0): duplicate effects of atomic procedures, duplicate radix.once() effects,
effects of failed attempts kept, effects without their tick's success (or the reverse), ticks run before
they were planned, overlapping attempts of one job or document, history over 256 rows for a job, ticks
neither run, failed, missed (past a start deadline) nor coalesced (or coalesced beyond the state's count), or
with more than one of these outcomes, leases left after the clean
stop, unexpected daemon exits or unclean stops, and stalls after a kill longer than ``max_stall_s``.
Dependencies: a dependent's tick for every planned time all its upstreams ended at as its edges name (run
once, failed, or still queued at the stop), for no other planned time, never run twice, never started before
its upstreams' markers. Groups: never more overlapping committed attempts of a group's jobs than its
max_running.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg

from radixjobs import schedule
from radixjobs.model import EverySchedule

ATOMIC_KINDS = ("atomic", "conflict", "cron", "at", "flaky", "grouped")
FLAKY_FAILS = "abs(hashtext(key)) % 4 = 0"  # the ticks chaos.flaky fails (chaos_setup.py)

OVERLAPS = """
SELECT {key}, count(*) FROM (
    SELECT {key}, started,
           max(finished) OVER (PARTITION BY {key} ORDER BY started, id
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS previous_end
    FROM {table}) x
WHERE started < previous_end GROUP BY {key}
"""

JOBS = """
SELECT j.job_id, j.schema_name || '.' || j.job_name, j.schedule_kind, j.interval_ns, j.starting_at_ns,
       radix.to_ns(j.created_at), j.cron_expression, j.cron_time_zone, s.anchor_ns, s.planned_ns, s.status,
       s.coalesced_ticks, s.lease_token IS NOT NULL
FROM radix.jobs j JOIN radix.radix_system_job_state s USING (job_id)
"""


VIOLATIONS = ("duplicate_atomic_effects", "duplicate_once_effects", "failed_attempt_effects_kept",
              "effects_without_a_frame", "ran_before_planned", "overlapping_job_attempts", "overlapping_document_runs",
              "history_over_256", "unaccounted_ticks", "leases_left_after_stop", "atomic_effects_without_success",
              "successes_without_effect", "non_atomic_successes_without_once_effect", "one_time_job_mismatch",
              "stall_after_kill_over_limit", "job_gap_over_limit", "unclean_stops", "unexpected_daemon_exits",
              "requested_runs_not_run", "requested_runs_run_twice", "dependent_ticks_lost",
              "dependent_ticks_stuck", "dependent_ticks_unexpected", "dependent_ticks_not_once",
              "dependent_ran_before_upstream", "group_over_max_running")


@dataclass
class Report:
    figures: dict[str, Any] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VIOLATIONS, 0))
    details: dict[str, list[str]] = field(default_factory=dict)

    def violation(self, name: str, count: int, detail: list[str] | None = None) -> None:
        self.violations[name] = self.violations.get(name, 0) + int(count)
        if detail:
            self.details.setdefault(name, []).extend(detail[:10])


def scalar(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(query.encode(), params or None).fetchone()
    return None if row is None else row[0]


def check_effects(conn: psycopg.Connection[Any], report: Report) -> None:
    """Duplicates, kept effects of failed attempts, effects before their tick, overlaps."""
    report.violation("duplicate_atomic_effects", scalar(conn, """
        SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM chaos.effects WHERE kind = ANY (%s)
        GROUP BY key HAVING count(*) > 1) d""", (list(ATOMIC_KINDS),)))
    report.violation("duplicate_once_effects", scalar(conn, """
        SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM chaos.effects
        WHERE kind = 'non_atomic' AND once GROUP BY key HAVING count(*) > 1) d"""))
    report.violation("failed_attempt_effects_kept", scalar(conn, """
        SELECT count(*) FROM chaos.effects WHERE kind = 'fail'
           OR (kind = 'conflict' AND attempt <= abs(hashtext(key)) % 3) OR (kind = 'flaky' AND """
        + FLAKY_FAILS + ")"))
    report.violation("effects_without_a_frame", scalar(conn, "SELECT count(*) FROM chaos.effects WHERE key IS NULL"))
    early = conn.execute("""
        SELECT key, started FROM chaos.effects
        WHERE started < radix.from_ns(split_part(key, '/', 2)::bigint)""").fetchall()
    report.violation("ran_before_planned", len(early), [f"{k} started {s}" for k, s in early])
    overlaps = conn.execute(OVERLAPS.format(key="job", table="chaos.effects").encode()).fetchall()
    report.violation("overlapping_job_attempts", sum(n for _, n in overlaps), [f"job {j}: {n}" for j, n in overlaps])
    doc_overlaps = conn.execute(OVERLAPS.format(key="num", table="chaos.doc_effects").encode()).fetchall()
    report.violation("overlapping_document_runs", sum(n for _, n in doc_overlaps),
                     [f"NUM {j}: {n}" for j, n in doc_overlaps])
    report.violation("history_over_256", scalar(conn, """
        SELECT count(*) FROM (SELECT job_id FROM radix.radix_system_job_history GROUP BY job_id
        HAVING count(*) > 256) h"""))
    report.figures.update({
        "effects": scalar(conn, "SELECT count(*) FROM chaos.effects"),
        "non_atomic_repeats": scalar(conn, "SELECT count(*) FROM chaos.effects WHERE kind = 'non_atomic' AND NOT once"),
        "document_runs": scalar(conn, "SELECT count(*) FROM chaos.doc_effects"),
        "max_history_rows_per_job": scalar(conn, """SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n
            FROM radix.radix_system_job_history GROUP BY job_id) h"""),
    })


def _ticks(conn: psycopg.Connection[Any]) -> dict[Any, dict[int, set[str]]]:
    """job id -> planned tick -> terminal outcomes seen in the ledger."""
    out: dict[Any, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for job, planned, status in conn.execute(
            "SELECT job_id, planned_ns, status FROM chaos.ledger WHERE status IN ('succeeded', 'failed', 'missed') "
            "AND run_kind = 'schedule'"):
        out[job][planned].add(status)
    return out


def _first_tick(kind: str, interval_ns: int | None, starting_at_ns: int | None, created_ns: int,
                expression: str | None, zone: str | None, anchor: int) -> int:
    """The job's first due tick, as the engine planned it when the job was created (never re-armed here)."""
    if kind == "every":
        assert interval_ns is not None
        armed_at = anchor if starting_at_ns is None else created_ns  # without STARTING AT the anchor is it
        return schedule.initial_planned(EverySchedule(interval_ns, starting_at_ns), armed_at)
    assert expression is not None
    return schedule.next_cron_tick(expression, zone or "UTC", anchor)


def check_ticks(conn: psycopg.Connection[Any], report: Report, steps: dict[str, int]) -> None:
    """Every due tick of a recurring job was run, failed terminally, missed (its start deadline passed), or
    coalesced (as the state counts), and only one of these."""
    ticks = _ticks(conn)
    totals: defaultdict[str, int] = defaultdict(int)
    for (job, name, kind, interval_ns, starting_at_ns, created_ns, expr, zone, anchor, planned, status, coalesced,
         leased) in conn.execute(JOBS):
        if leased or status == "running":
            report.violation("leases_left_after_stop", 1, [f"{name} ({status})"])
        if kind in ("at", "after") or planned is None:  # an AFTER job's ticks: check_dependencies
            continue
        step, first = steps[name], _first_tick(kind, interval_ns, starting_at_ns, created_ns, expr, zone, anchor)
        due = max(0, (planned - first) // step)
        seen = ticks.get(job, {})
        off_grid = [t for t in seen if (t - first) % step or not first <= t < planned]
        run = sum(1 for outcomes in seen.values() if "succeeded" in outcomes)
        failed = sum(1 for outcomes in seen.values() if outcomes == {"failed"})
        missed = sum(1 for outcomes in seen.values() if outcomes == {"missed"})
        both = sum(1 for outcomes in seen.values() if len(outcomes) > 1)
        accounted = run + failed + missed + coalesced
        if off_grid or both or (planned - first) % step or due != accounted:
            report.violation("unaccounted_ticks", abs(due - accounted) + len(off_grid) + both,
                             [f"{name}: due {due} run {run} failed {failed} missed {missed} coalesced {coalesced} "
                              f"off-grid {len(off_grid)} both {both}"])
        for key, value in (("due", due), ("run", run), ("failed", failed), ("missed", missed),
                           ("coalesced", coalesced)):
            totals[key] += value
    report.figures.update({f"ticks_{k}": v for k, v in totals.items()})


def check_requested_runs(conn: psycopg.Connection[Any], report: Report, keys: list[str]) -> None:
    """Every RUN JOB request ended (succeeded or failed) exactly once, through kills and restarts."""
    ended = dict(conn.execute(
        "SELECT key, count(*) FROM chaos.ledger WHERE run_kind = 'run' AND status IN ('succeeded', 'failed') "
        "GROUP BY key").fetchall())
    missing = [k for k in keys if k not in ended]
    twice = [k for k in keys if ended.get(k, 0) > 1]
    report.violation("requested_runs_not_run", len(missing), missing[:10])
    report.violation("requested_runs_run_twice", len(twice), twice[:10])
    report.figures["requested_runs"] = len(keys)


def check_markers(conn: psycopg.Connection[Any], report: Report) -> None:
    """Atomic effects and success markers exist together; succeeded non-atomic ticks have their effect."""
    succeeded = {f"{job}/{planned}" for job, planned in conn.execute(
        "SELECT DISTINCT job_id, planned_ns FROM chaos.ledger WHERE status = 'succeeded'")}
    atomic = {k for (k,) in conn.execute("SELECT key FROM chaos.effects WHERE kind = ANY (%s)", (list(ATOMIC_KINDS),))}
    once = {k for (k,) in conn.execute("SELECT key FROM chaos.effects WHERE kind = 'non_atomic' AND once")}
    non_atomic_jobs = {str(j) for (j,) in conn.execute("SELECT job_id FROM radix.jobs WHERE non_atomic")}
    orphans = sorted(atomic - succeeded)
    report.violation("atomic_effects_without_success", len(orphans), orphans)
    lost = sorted(k for k in succeeded - atomic if k.split("/")[0] not in non_atomic_jobs)
    report.violation("successes_without_effect", len(lost), lost)
    lost_once = sorted(k for k in succeeded - once if k.split("/")[0] in non_atomic_jobs)
    report.violation("non_atomic_successes_without_once_effect", len(lost_once), lost_once)
    report.figures["non_atomic_effects_of_unfinished_ticks"] = len(once - succeeded)


def check_at_jobs(conn: psycopg.Connection[Any], report: Report, incarnations: list[dict[str, Any]]) -> None:
    """Each one-time job ran at most once, and exactly once if it is complete."""
    effects = dict(conn.execute("SELECT job, count(*) FROM chaos.effects WHERE kind = 'at' GROUP BY job").fetchall())
    states = dict(conn.execute("SELECT job_id, status FROM radix.radix_system_job_state").fetchall())
    complete = 0
    for inc in incarnations:
        status = inc.get("final_status") or states.get(inc["job_id"], "dropped")
        count = effects.get(inc["job_id"], 0)
        complete += status == "complete"
        if (status == "complete") != (count == 1) or count > 1:
            report.violation("one_time_job_mismatch", 1, [f"{inc['name']} {inc['job_id']}: {status}, {count} effects"])
    report.figures["one_time_jobs"] = len(incarnations)
    report.figures["one_time_jobs_complete"] = complete


STALL = """
SELECT min(done.finished_at) FROM chaos.ledger done
WHERE done.job_id = %(job)s AND done.status IN ('succeeded', 'failed')
  AND done.finished_at > coalesce((SELECT max(held.started_at) FROM chaos.ledger held
                                   WHERE held.job_id = %(job)s AND held.node = %(node)s AND held.status = 'running'
                                     AND held.started_at <= %(at)s), %(at)s)
"""


def check_stalls(conn: psycopg.Connection[Any], report: Report, kills: list[dict[str, Any]], end: dt.datetime,
                 max_stall_s: float) -> None:
    """For every kill: the time until each job the killed node held finished an attempt begun no earlier than
    the one it held (that one may itself commit after the kill: an attempt is sent to PostgreSQL whole)."""
    longest, worst = 0.0, ""
    for kill in kills:
        for job in kill["held"] or []:
            row = conn.execute(STALL.encode(), {"job": job, "node": kill["node"], "at": kill["at"]}).fetchone()
            finished = row[0] if row and row[0] else end
            stall = max(0.0, (finished - kill["at"]).total_seconds())
            if stall > longest:
                longest, worst = stall, f"{kill['node']} killed at {kill['at'].isoformat()}: job {job}"
    report.figures["longest_stall_after_kill_s"] = round(longest, 3)
    report.figures["longest_stall_where"] = worst
    if longest > max_stall_s:
        report.violation("stall_after_kill_over_limit", 1, [f"{longest:.1f} s > {max_stall_s} s: {worst}"])


GAPS = """
SELECT job_id, finished_at, gap FROM (
    SELECT job_id, finished_at, extract(epoch FROM finished_at - lag(finished_at) OVER w) AS gap
    FROM chaos.ledger WHERE status IN ('succeeded', 'failed') AND job_id = ANY (%s)
    WINDOW w AS (PARTITION BY job_id ORDER BY finished_at)) g
WHERE gap IS NOT NULL ORDER BY gap DESC LIMIT 1
"""


def check_gaps(conn: psycopg.Connection[Any], report: Report, max_stall_s: float) -> None:
    """The longest time a recurring job (every 1-5 s) went without finishing an attempt: what a kill, a
    PostgreSQL restart or a lost claim cost it. (An AFTER job runs as often as its upstreams end as named.)"""
    jobs = [r[0] for r in conn.execute("SELECT job_id FROM radix.jobs WHERE schedule_kind IN ('every', 'cron')")]
    row = conn.execute(GAPS.encode(), (jobs,)).fetchone()
    gap = float(row[2]) if row else 0.0
    report.figures["longest_gap_between_attempts_s"] = round(gap, 3)
    report.figures["longest_gap_where"] = f"job {row[0]} until {row[1].isoformat()}" if row else ""
    if gap > max_stall_s + 5:
        report.violation("job_gap_over_limit", 1, [f"{gap:.1f} s: {report.figures['longest_gap_where']}"])


def ledger_figures(conn: psycopg.Connection[Any], report: Report) -> None:
    rows = conn.execute("""SELECT status, count(DISTINCT history_id) FROM chaos.ledger
                           WHERE status <> 'running' GROUP BY status""").fetchall()
    report.figures["attempts_by_outcome"] = dict(sorted(rows))
    report.figures["max_attempt"] = scalar(conn, "SELECT coalesce(max(attempt), 0) FROM chaos.ledger")


def _ends(conn: psycopg.Connection[Any]) -> dict[str, dict[int, dict[str, dt.datetime]]]:
    """job id -> planned tick -> how it ended for good ('succeeded', 'failed') -> when; RUN JOB ticks left out
    (they fire no edge)."""
    out: dict[str, dict[int, dict[str, dt.datetime]]] = defaultdict(lambda: defaultdict(dict))
    for job, planned, status, finished in conn.execute(
            "SELECT job_id::text, planned_ns, status, min(finished_at) FROM chaos.ledger "
            "WHERE status IN ('succeeded', 'failed') AND run_kind <> 'run' GROUP BY 1, 2, 3"):
        out[job][planned][status] = finished
    return out


def _reached(ends: dict[int, dict[str, dt.datetime]], condition: str) -> dict[int, dt.datetime]:
    """The planned ticks an upstream ended at as ``condition`` names, with when they ended."""
    named = {"succeeds": ("succeeded",), "fails": ("failed",), "completes": ("succeeded", "failed")}[condition]
    return {planned: min(when for status, when in outcomes.items() if status in named)
            for planned, outcomes in ends.items() if any(status in named for status in outcomes)}


DEPENDENT_EFFECTS = """
SELECT split_part(key, '/', 2)::bigint, count(*), min(started) FROM chaos.effects
WHERE job = %s AND (kind = ANY (%s) OR (kind = 'non_atomic' AND once)) GROUP BY 1
"""

PENDING = """
SELECT planned_ns FROM radix.job_requests WHERE job_id = %(job)s AND kind = 'after'
UNION SELECT planned_ns FROM radix.radix_system_job_state WHERE job_id = %(job)s AND request_kind = 'after'
"""


def _once(effects: int, succeeded: bool, non_atomic: bool) -> bool:
    """Atomic: one effect exactly when the tick succeeded. radix.once(): at most one, and one if it succeeded
    (it commits inside, so a tick that failed or is still queued may have it already)."""
    if non_atomic:
        return effects == 1 if succeeded else effects <= 1
    return effects == int(succeeded)


def check_dependencies(conn: psycopg.Connection[Any], report: Report, edges: dict[str, list[tuple[str, str]]],
                       end: dt.datetime, max_stall_s: float) -> None:
    """Every planned tick all of a dependent's upstreams ended at as its edges name gave the dependent one tick
    with that planned time: succeeded with exactly one effect, failed for good with none, or still queued at
    the stop (then queued no longer than ``max_stall_s`` before ``end``); no other planned time ran; none
    started before its last upstream's marker committed."""
    ids = {name: str(job) for job, name in conn.execute(
        "SELECT job_id, schema_name || '.' || job_name FROM radix.jobs")}
    ends = _ends(conn)
    non_atomic = {str(j) for (j,) in conn.execute("SELECT job_id FROM radix.jobs WHERE non_atomic")}
    totals: defaultdict[str, int] = defaultdict(int)
    longest_queued = 0.0
    for dependent, upstreams in edges.items():
        job = ids[dependent]
        arrivals = [_reached(ends.get(ids[up], {}), condition) for up, condition in upstreams]
        expected = {p: max(a[p] for a in arrivals) for p in set.intersection(*(set(a) for a in arrivals))}
        own = ends.get(job, {})
        started = {p for (p,) in conn.execute(
            "SELECT DISTINCT planned_ns FROM chaos.ledger WHERE job_id = %s", (job,))}
        effects = {p: (n, first) for p, n, first in conn.execute(DEPENDENT_EFFECTS.encode(),
                                                                 (job, list(ATOMIC_KINDS)))}
        pending = {p for (p,) in conn.execute(PENDING.encode(), {"job": job})}
        lost = sorted(p for p in expected if p not in own and p not in pending)
        queued = [p for p in expected if p in pending and p not in own]
        stuck = sorted(p for p in queued if (end - expected[p]).total_seconds() > max_stall_s)
        unexpected = sorted((started | set(effects) | pending) - set(expected))
        not_once = sorted(p for p in expected if not _once(effects.get(p, (0,))[0], "succeeded" in own.get(p, {}),
                                                              job in non_atomic))
        early = sorted(p for p, (_, first) in effects.items() if p in expected and first <= expected[p])
        for name, found in (("dependent_ticks_lost", lost), ("dependent_ticks_stuck", stuck),
                            ("dependent_ticks_unexpected", unexpected),
                            ("dependent_ticks_not_once", not_once), ("dependent_ran_before_upstream", early)):
            report.violation(name, len(found), [f"{dependent} at {p}" for p in found])
        totals["expected"] += len(expected)
        totals["succeeded"] += sum(1 for p in expected if "succeeded" in own.get(p, {}))
        totals["failed"] += sum(1 for p in expected if own.get(p, {}).keys() == {"failed"})
        totals["queued_at_stop"] += len(queued)
        longest_queued = max([longest_queued] + [(end - expected[p]).total_seconds() for p in queued])
    report.figures.update({f"dependent_ticks_{k}": v for k, v in totals.items()})
    report.figures["dependent_longest_queued_at_stop_s"] = round(longest_queued, 3)


def _most_at_once(spans: list[tuple[dt.datetime, dt.datetime]]) -> tuple[int, dt.datetime | None]:
    """The most spans that overlap at one instant, and the first instant it happened (an end before a start
    at the same instant)."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    level = top = 0
    when = None
    for at, step in edges:
        level += step
        if level > top:
            top, when = level, at
    return top, when


def check_groups(conn: psycopg.Connection[Any], report: Report, groups: dict[str, tuple[int, list[str]]]) -> None:
    """At no instant more committed attempts of a group's jobs ran than its max_running (their spans: the
    attempt's transaction start to its procedure's end, both inside the claim holding the place)."""
    most: dict[str, int] = {}
    for group, (max_running, names) in groups.items():
        spans = conn.execute("""SELECT e.started, e.finished FROM chaos.effects e JOIN radix.jobs j ON j.job_id = e.job
                                WHERE j.schema_name || '.' || j.job_name = ANY (%s)""", (names,)).fetchall()
        most[group], when = _most_at_once(spans)
        if most[group] > max_running:
            report.violation("group_over_max_running", most[group] - max_running,
                             [f"{group}: {most[group]} > max_running {max_running} at {when}"])
        report.figures[f"group_{group}_attempts"] = len(spans)
    report.figures["group_most_running_at_once"] = most
