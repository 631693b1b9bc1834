"""The DST matrix of docs/guarantees.md, row by row: each row is what ``radixjobs jobs next`` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixjobs.cli.jobs import jobs_group
from tests.apps import App

DOC = Path(__file__).resolve().parents[2] / "docs" / "guarantees.md"
SECTION = "## Cron and daylight saving time"


def matrix() -> list[list[str]]:
    """The section's table rows as cells (backticks dropped; a cell's ticks joined by <br>)."""
    section = DOC.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert lines[0].split("|")[1:-1] == [" case ", " zone ", " cron ", " from ", " planned (UTC) ", " local "]
    return [[cell.strip().replace("`", "") for cell in line.split("|")[1:-1]] for line in lines[2:]]


ROWS = matrix()


def test_the_matrix_covers_the_cases() -> None:
    zones = {row[1] for row in ROWS}
    assert {"Europe/Berlin", "Australia/Lord_Howe", "Asia/Tokyo"} <= zones
    assert any("spring" in row[0] for row in ROWS)
    assert any("fall" in row[0] for row in ROWS)


@pytest.mark.parametrize(("case", "zone", "cron", "start", "utc", "local"), ROWS, ids=[row[0] for row in ROWS])
def test_dst_matrix_row(app: App, case: str, zone: str, cron: str, start: str, utc: str, local: str) -> None:
    app.job(f"CREATE JOB app.dst SCHEDULE CRON '{cron}' TIME ZONE '{zone}' RUN AS {{p}} CALL app.record('x')")
    expected = list(zip(utc.split("<br>"), local.split("<br>"), strict=True))
    result = CliRunner().invoke(jobs_group, ["next", "app.dst", "--from", start, "--count", str(len(expected)),
                                             "--json"], env={"RADIXJOBS_DSN": app.dsn})
    assert result.exit_code == 0, (result.output, result.exception)
    shown = json.loads(result.output)
    assert shown["time_zone"] == zone
    assert [(t["utc"], t["local"]) for t in shown["ticks"]] == expected, case
