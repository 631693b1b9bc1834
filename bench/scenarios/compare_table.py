"""The table of ``bench/run.py compare``: one column per peer, one row per figure, each cell the median over
the repetitions with its range, ratios to the one-connection commit rate of the same run."""

from __future__ import annotations

from typing import Any

ROWS = (  # (label, figure, format, ratio figure or None)
    ("burst: jobs/s (× baseline commits/s)", "jobs_per_s", "{:,.0f}", "ratio_to_baseline"),
    ("burst: scheduler CPU µs/job", "scheduler_cpu_us_per_job", "{:,.0f}", None),
    ("burst: server CPU µs/job", "server_cpu_us_per_job", "{:,.0f}", None),
    ("burst: CPU/job ÷ CPU/baseline commit", "cpu_ratio_to_baseline", "{:.1f}×", None),
    ("ticks: lateness p50 ms", "lateness_p50_ms", "{:,.1f}", None),
    ("ticks: lateness p99 ms", "lateness_p99_ms", "{:,.1f}", None),
    ("ticks: missed (of expected)", "ticks_missed", "{:,.0f}", "ticks_expected"),
    ("ticks: duplicates", "duplicate_ticks", "{:,.0f}", None),
    ("minute-burst: lateness p50 ms", "minute-burst.lateness_p50_ms", "{:,.1f}", None),
    ("minute-burst: lateness p99 ms", "minute-burst.lateness_p99_ms", "{:,.1f}", None),
    ("minute-burst: lateness max ms", "minute-burst.lateness_max_ms", "{:,.1f}", None),
    ("minute-burst: runs succeeded (of due)", "minute-burst.runs_succeeded", "{:,.0f}", "minute-burst.due_runs"),
    ("minute-burst: start failures", "minute-burst.start_failures", "{:,.0f}", None),
    ("minute-burst: most running at once", "minute-burst.peak_running", "{:,.0f}", None),
    ("minute-burst: runs/s", "minute-burst.runs_per_s", "{:,.0f}", None),
    ("minute-burst: scheduler process CPU ms/run", "minute-burst.scheduler_cpu_ms_per_run", "{:,.2f}", None),
    ("minute-burst: server CPU ms/run", "minute-burst.server_cpu_ms_per_run", "{:,.2f}", None),
    ("minute-burst: history rows", "minute-burst.history_rows", "{:,.0f}", None),
    ("minutely: lateness p50 ms", "minutely.lateness_p50_ms", "{:,.1f}", None),
    ("minutely: lateness p99 ms", "minutely.lateness_p99_ms", "{:,.1f}", None),
    ("minutely: lateness max ms", "minutely.lateness_max_ms", "{:,.1f}", None),
    ("minutely: runs succeeded (of due)", "minutely.runs_succeeded", "{:,.0f}", "minutely.due_runs"),
    ("minutely: start failures", "minutely.start_failures", "{:,.0f}", None),
    ("minutely: history rows", "minutely.history_rows", "{:,.0f}", None),
    ("minutely: background load commits/s", "minutely.load_commits_per_s", "{:,.0f}", None),
    ("overrun: lateness p50 ms", "overrun.lateness_p50_ms", "{:,.0f}", None),
    ("overrun: lateness max ms", "overrun.lateness_max_ms", "{:,.0f}", None),
    ("overrun: runs succeeded (of due)", "overrun.runs_succeeded", "{:,.0f}", "overrun.due_runs"),
    ("overrun: due minutes not run", "overrun.missed_minutes", "{:,.0f}", None),
    ("overrun: coalesced ticks", "overrun.coalesced_ticks", "{:,.0f}", None),
    ("overrun: overlapping runs", "overrun.overlaps", "{:,.0f}", None),
    ("overrun: history rows", "overrun.history_rows", "{:,.0f}", None),
)


def cell(spread: dict[str, float] | None, fmt: str) -> str:
    """``median`` or ``median [min–max]``; a dash when there is no figure."""
    if spread is None:
        return "—"
    text = fmt.format(spread["median"])
    if spread["min"] != spread["max"]:
        text += f" [{fmt.format(spread['min'])}–{fmt.format(spread['max'])}]"
    return text


def render(result: dict[str, Any]) -> str:
    compare = result["compare"]
    summary, settings = compare["summary"], compare["settings"]
    peers = settings["peers"]
    workloads = settings.get("workloads", ["burst", "ticks"])
    described = [f"burst of {settings['jobs']:,} jobs"] if "burst" in workloads else []
    if "ticks" in workloads:
        described.append(f"{settings['tick_jobs']:,} jobs every second for {settings['seconds']:g} s "
                         f"({settings['phase']})")
    if "minute-burst" in workloads:
        described.append(f"minute-burst: {settings['cron_jobs']:,} jobs due at one minute, {settings['work_ms']} ms "
                         f"each")
    if "minutely" in workloads:
        described.append(f"minutely: {settings['minutely_jobs']} job(s) every minute for {settings['minutes']} "
                         f"minutes, {settings['load_clients']} load clients")
    if "overrun" in workloads:
        described.append(f"overrun: 1 job every minute running {settings['overrun_seconds']:g} s, "
                         f"{settings['overrun_minutes']} minutes")
    lines = [
        f"compare: {'; '.join(described)}; concurrency {settings['concurrency']}"
        + (f" ({settings['cron_slots']} in the minute workloads)" if "cron_slots" in settings else "")
        + f"; {settings['repeat']} repetition(s): median [min–max]",
        f"baseline: one-connection commits/s {cell(summary['baseline_commits_per_s'], '{:,.0f}')}; "
        f"CPU per commit (client + server) µs {cell(summary['baseline_cpu_us_per_commit'], '{:,.0f}')} "
        "(each repetition: the mean of a measurement before its peers and one after)",
    ]
    table = [["", *peers]]
    for label, key, fmt, extra in ROWS:
        row = [label]
        for peer in peers:
            figures = summary.get(peer, {})
            text = cell(figures.get(key), fmt)
            if extra is not None and figures.get(extra) is not None:
                ratio = figures[extra]["median"]
                text += f" ({ratio:.3f}×)" if extra == "ratio_to_baseline" else f" (of {ratio:,.0f})"
            row.append(text)
        if any(text != "—" for text in row[1:]):
            table.append(row)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        lines.append("  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip())
    env = result.get("environment", {})
    lines.append(f"date {env.get('date_utc')}  commit {env.get('commit')}  cpus {env.get('cpus')}  "
                 f"load avg 1m {env.get('load_avg_1m')}  (--json for every figure of every run)")
    return "\n".join(lines)
