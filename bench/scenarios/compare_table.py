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
    lines = [
        f"compare: burst of {settings['jobs']:,} jobs; {settings['tick_jobs']:,} jobs every second for "
        f"{settings['seconds']:g} s ({settings['phase']}); concurrency {settings['concurrency']}; "
        f"{settings['repeat']} repetition(s): median [min–max]",
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
