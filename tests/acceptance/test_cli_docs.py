"""``radixjobs docs``: apply / list / show / run, as a user types them.

The group is exercised with click's CliRunner on ``radixjobs.cli.docs.docs_group``; once the group is
registered in ``radixjobs.cli``, the subprocess test at the end runs the real command too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from radixjobs.cli.docs import docs_group
from radixjobs.errors import RadixError
from tests.acceptance.conftest import Run
from tests.support import SEED


@pytest.fixture
def docs(db: str) -> Any:
    def run(*args: str, stdin: str | None = None) -> Result:
        return CliRunner().invoke(docs_group, list(args), env={"RADIXJOBS_DSN": db}, input=stdin)

    return run


@pytest.fixture
def seed_file(tmp_path: Path, conn: psycopg.Connection[Any]) -> Path:
    conn.execute("CREATE TABLE public.archived (at timestamptz DEFAULT clock_timestamp());"
                 "CREATE FUNCTION public.archive_logs() RETURNS void LANGUAGE sql AS "
                 "'INSERT INTO public.archived DEFAULT VALUES'")
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(SEED, ensure_ascii=False), encoding="utf-8")
    return path


def test_apply_twice_changes_nothing(docs: Any, seed_file: Path, conn: psycopg.Connection[Any]) -> None:
    first = docs("apply", str(seed_file))
    assert first.exit_code == 0, first.output
    assert "101" in first.stdout
    assert "created" in first.stdout
    before = conn.execute("SELECT version, updated_at FROM radix.cron_table").fetchall()
    second = docs("apply", "--json", str(seed_file))
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout) == [{"num": "101", "action": "unchanged", "version": 1, "ignored": []}]
    assert conn.execute("SELECT version, updated_at FROM radix.cron_table").fetchall() == before


def test_a_bad_document_prints_every_problem_and_writes_nothing(docs: Any, tmp_path: Path,
                                                                conn: psycopg.Connection[Any]) -> None:
    bad = [dict(SEED), {"dockind": "CRON_TABLE", "status": "ON",
                        "props": {"NUM": 7, "DB_FUNCTION": "f", "CSP_SERVICE": "s", "MAX_COUNT_ERROR": -1,
                                  "INTERVAL": "now()); DROP TABLE x; SELECT (now()"}}]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad), encoding="utf-8")
    result = docs("apply", str(path))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "radixjobs: error: CRON_TABLE document rejected: 4 problems",
        "  - document 2 (NUM 7): status must be CRON_TABLE_ACTIVE, CRON_TABLE_PASSIVE or CRON_TABLE_ERROR, "
        "not 'ON'",
        "  - document 2 (NUM 7): DB_FUNCTION and CSP_SERVICE exclude each other: give exactly one",
        "  - document 2 (NUM 7): MAX_COUNT_ERROR must be an integer from 0 to 2147483647",
        "  - document 2 (NUM 7): INTERVAL is refused: syntax error at or near \")\" at character 6",
    ]
    assert conn.execute("SELECT count(*) FROM radix.cron_table").fetchone() == (0,)
    as_json = docs("apply", "--json", str(path))
    assert as_json.exit_code == 1
    assert len(json.loads(as_json.stdout)["problems"]) == 4


def test_database_side_problems_are_reported_too(docs: Any, tmp_path: Path) -> None:
    path = tmp_path / "run_as.json"
    path.write_text(json.dumps({**SEED, "props": {**SEED["props"], "RUN_AS": "no_such_role_x"}}), encoding="utf-8")
    result = docs("apply", str(path))
    assert result.exit_code == 1
    assert "NUM 101: RUN_AS role 'no_such_role_x' does not exist" in result.stderr


def test_invalid_json_is_a_clear_error(docs: Any, tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{", encoding="utf-8")
    result = docs("apply", str(path))
    assert result.exit_code == 1
    assert isinstance(result.exception, RadixError)
    assert "is not valid JSON" in str(result.exception)


def test_apply_from_standard_input_then_list_show_and_run(docs: Any, seed_file: Path) -> None:
    assert docs("apply", "-", stdin=seed_file.read_text(encoding="utf-8")).exit_code == 0
    listed = docs("list", "--json")
    assert listed.exit_code == 0, listed.output
    [doc] = json.loads(listed.stdout)
    assert (doc["dockind"], doc["status"], doc["props"]["NUM"]) == ("CRON_TABLE", "CRON_TABLE_ACTIVE", 101)
    assert doc["props"]["COUNT_ERROR"] == 0
    assert doc["props"]["NEXT_RUN"] is None
    assert "archive_logs" in docs("list").stdout

    ran = docs("run", "--once", "--json")
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["runs"] == 1

    shown = docs("show", "101", "--json")
    assert shown.exit_code == 0, shown.output
    props = json.loads(shown.stdout)["props"]
    assert props["LAST_RUN"] is not None
    assert props["NEXT_RUN"] > props["LAST_RUN"]
    human = docs("show", "101")
    assert "system processes:" in human.stdout
    assert "completed" in human.stdout
    missing = docs("show", "999")
    assert missing.exit_code == 1
    assert "does not exist" in str(missing.exception)


def test_run_needs_once_or_for(docs: Any) -> None:
    result = docs("run")
    assert result.exit_code == 2
    assert "exactly one of --once or --for" in result.output


def test_registered_in_the_radixjobs_command(cli: Run, seed_file: Path) -> None:
    from radixjobs.cli import cli as root

    if "docs" not in root.commands:
        pytest.skip("the docs group is not registered in radixjobs.cli yet")
    first = cli("docs", "apply", str(seed_file))
    assert first.returncode == 0, first.stderr
    again = cli("docs", "apply", "--json", str(seed_file))
    assert json.loads(again.stdout)[0]["action"] == "unchanged"
    bad = cli("docs", "apply", "-", input=json.dumps({"dockind": "CRON_TABLE", "props": {}}))
    assert bad.returncode == 1
    assert "status is missing" in bad.stderr
    assert "NUM is missing" in bad.stderr


def test_a_disabled_document_is_applied_and_left_alone_by_the_real_command(cli: Run, seed_file: Path, tmp_path: Path,
                                                                           conn: psycopg.Connection[Any]) -> None:
    """The seed: any status but ACTIVE disables the task. ``docs apply`` takes it; ``docs run`` does not run it."""
    disabled = tmp_path / "disabled.json"
    disabled.write_text(json.dumps({**SEED, "status": "CRON_TABLE_DISABLED"}, ensure_ascii=False), encoding="utf-8")
    applied = cli("docs", "apply", "--json", str(disabled))
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout) == [{"num": "101", "action": "created", "version": 1, "ignored": []}]
    ran = cli("docs", "run", "--once", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["runs"] == 0
    assert [d["status"] for d in json.loads(cli("docs", "list", "--json").stdout)] == ["CRON_TABLE_PASSIVE"]
    assert conn.execute("SELECT count(*) FROM public.archived").fetchone() == (0,)

    active = cli("docs", "apply", "--json", str(seed_file))  # ACTIVE again: re-armed, due at FIRST_RUN (past)
    assert json.loads(active.stdout)[0]["action"] == "updated"
    assert json.loads(cli("docs", "run", "--once", "--json").stdout)["runs"] == 1
    assert conn.execute("SELECT count(*) FROM public.archived").fetchone() == (1,)
