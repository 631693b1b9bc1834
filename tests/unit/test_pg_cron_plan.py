"""pg_cron rows to plans: schedules, commands, names (pure)."""

from __future__ import annotations

import pytest

from radixjobs.imports.pg_cron import Outcome, plan
from radixjobs.imports.pg_cron_plan import (
    CronJobRow,
    JobPlan,
    Unmappable,
    dollar_tag,
    job_names,
    map_command,
    map_schedule,
    sanitise_name,
)
from radixjobs.model import CronSchedule, EverySchedule, QualifiedName


@pytest.mark.parametrize(("text", "expected"), [
    ("0 3 * * *", CronSchedule("0 3 * * *", "UTC")),
    ("  */5   *  * * 1-5 ", CronSchedule("*/5 * * * 1-5", "UTC")),
    ("@daily", CronSchedule("0 0 * * *", "UTC")),
    ("@HOURLY", CronSchedule("0 * * * *", "UTC")),
    ("@weekly", CronSchedule("0 0 * * 0", "UTC")),
    ("@monthly", CronSchedule("0 0 1 * *", "UTC")),
    ("@yearly", CronSchedule("0 0 1 1 *", "UTC")),
    ("30 seconds", EverySchedule(30_000_000_000)),
    ("1 second", EverySchedule(1_000_000_000)),
    ("5seconds", EverySchedule(5_000_000_000)),
])
def test_schedules_that_map(text: str, expected: object) -> None:
    assert map_schedule(text, "UTC") == expected


@pytest.mark.parametrize(("text", "reason"), [
    ("0 0 $ * *", "last day of the month"),
    ("@reboot", "server start"),
    ("0 seconds", "at least 1 second"),
    ("* * * *", "5 cron fields"),
    ("0 0 * * * *", "5 cron fields"),
    ("61 * * * *", "invalid cron expression"),
    ("every day", "5 cron fields"),
])
def test_schedules_that_do_not(text: str, reason: str) -> None:
    with pytest.raises(Unmappable, match=reason):
        map_schedule(text, "UTC")


def test_cron_time_zone_is_kept() -> None:
    assert map_schedule("0 3 * * *", "Europe/Berlin") == CronSchedule("0 3 * * *", "Europe/Berlin")


def test_single_qualified_call_with_constants_is_a_direct_call() -> None:
    command = map_command("CALL app.rollup(since => INTERVAL '2 hours', kinds => ARRAY['a', 'b']); -- nightly")
    assert command.body is None
    assert command.procedure == QualifiedName("app", "rollup")
    assert [a.name for a in command.arguments] == ["since", "kinds"]


@pytest.mark.parametrize(("text", "why"), [
    ("CALL rollup(1)", "schema-qualified"),
    ("CALL app.rollup(now())", "function calls"),
])
def test_other_calls_are_wrapped_as_calls(text: str, why: str) -> None:
    command = map_command(text)
    assert command.procedure is None
    assert command.body is not None
    assert "    CALL " in command.body  # plpgsql CALL, so a procedure that commits still can
    assert "EXECUTE" not in command.body
    assert why in command.note


def test_statements_are_executed_in_order_with_safe_tags() -> None:
    text = "INSERT INTO t VALUES ('$cmd$'); SELECT f($$x$$) -- trailing comment"
    command = map_command(text)
    assert command.body == ("BEGIN\n"
                            "    EXECUTE $cmd1$INSERT INTO t VALUES ('$cmd$')$cmd1$;\n"
                            "    EXECUTE $cmd$SELECT f($$x$$) -- trailing comment$cmd$;\n"  # (a tag per statement)
                            "END\n")


def test_begin_commit_envelope_is_dropped() -> None:
    command = map_command("BEGIN; DELETE FROM t; COMMIT;")
    assert command.body == "BEGIN\n    EXECUTE $cmd$DELETE FROM t$cmd$;\nEND\n"
    assert "BEGIN/COMMIT dropped" in command.note


@pytest.mark.parametrize(("text", "reason"), [
    ("VACUUM t", "VACUUM"),
    ("VACUUM (ANALYZE) t; SELECT 1", "VACUUM"),
    ("CREATE DATABASE d", "CREATE DATABASE"),
    ("CREATE INDEX CONCURRENTLY i ON t (x)", "CONCURRENTLY"),
    ("DROP INDEX CONCURRENTLY i", "CONCURRENTLY"),
    ("REINDEX TABLE CONCURRENTLY t", "CONCURRENTLY"),
    ("REINDEX DATABASE d", "REINDEX DATABASE"),
    ("ALTER SYSTEM SET work_mem = '1GB'", "ALTER SYSTEM"),
    ("CLUSTER", "CLUSTER"),
    ("DELETE FROM t; COMMIT; DELETE FROM u", "transaction control"),
    ("BEGIN ISOLATION LEVEL SERIALIZABLE; DELETE FROM t; COMMIT", "transaction control"),
    ("SAVEPOINT a", "transaction control"),
    ("COPY t FROM STDIN", "client"),
    ("SELECT * INTO t2 FROM t", "CREATE TABLE"),
    ("", "empty"),
    ("-- nothing", "empty"),
    ("SELEC 1", "not valid SQL"),
])
def test_commands_that_cannot_run_in_a_procedure(text: str, reason: str) -> None:
    with pytest.raises(Unmappable, match=reason):
        map_command(text)


@pytest.mark.parametrize("text", ["ANALYZE t", "REINDEX TABLE t", "CLUSTER t USING i", "DO $$BEGIN END$$",
                                  "REFRESH MATERIALIZED VIEW m", "COPY t TO '/tmp/x.csv'"])
def test_commands_that_can(text: str) -> None:
    assert map_command(text).body is not None


def test_dollar_tag_avoids_every_occurrence() -> None:
    assert dollar_tag("plain") == "cmd"
    assert dollar_tag("x $cmd$ y cmd1") == "cmd2"
    assert dollar_tag("ends with $cmd") == "cmd1"


@pytest.mark.parametrize(("jobname", "expected"), [
    ("nightly", "nightly"), ("Nightly Vacuum!", "nightly_vacuum"), ("a--b__c", "a_b_c"),
    ("3am", "job_3am"), ("ÄÖÜ", None), ("", None), (None, None), ("x" * 100, "x" * 63),
])
def test_sanitise_name(jobname: str | None, expected: str | None) -> None:
    assert sanitise_name(jobname) == expected


def test_job_names_are_unique_and_stable() -> None:
    rows = [CronJobRow(1, "* * * * *", "SELECT 1", jobname="clean up"),
            CronJobRow(2, "* * * * *", "SELECT 1", jobname="clean-up"),
            CronJobRow(3, "* * * * *", "SELECT 1"),
            CronJobRow(4, "* * * * *", "SELECT 1", jobname="report")]
    assert job_names(rows) == {1: "clean_up_1", 2: "clean_up_2", 3: "pg_cron_3", 4: "report"}
    assert job_names(reversed(rows)) == job_names(rows)


def _plan(**fields: object) -> JobPlan | Outcome:
    row = CronJobRow(**{"jobid": 7, "schedule": "* * * * *", "command": "SELECT 1", "username": "ops",
                        "database": "app", "nodeport": 5432, **fields})  # type: ignore[arg-type]
    return plan(row, QualifiedName("cron_import", "j"), database="app", port=5432, time_zone="UTC")


def test_plan_skips_other_databases_and_nodes() -> None:
    assert isinstance(_plan(), JobPlan)
    assert isinstance(_plan(nodename="/var/run/postgresql", nodeport=None), JobPlan)
    other_db = _plan(database="billing")
    assert isinstance(other_db, Outcome)
    assert (other_db.action, other_db.job) == ("skipped", "cron_import.j")
    assert "--database billing" in other_db.reason
    for node in ({"nodename": "db2.internal"}, {"nodeport": 5433}):
        remote = _plan(**node)
        assert isinstance(remote, Outcome)
        assert remote.action == "skipped"
    no_user = _plan(username=None)
    assert isinstance(no_user, Outcome)
    assert no_user.action == "unmapped"


def test_row_from_an_old_pg_cron_without_jobname_or_active() -> None:
    row = CronJobRow.from_record({"jobid": 3, "schedule": "@daily", "command": "SELECT 1", "nodename": "localhost",
                                  "nodeport": 5432, "database": "app", "username": "ops"})
    assert (row.jobname, row.active) == (None, True)
