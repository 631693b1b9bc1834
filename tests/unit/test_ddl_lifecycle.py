"""The lifecycle grammar (pure parser): RUN JOB, FOR RANGE, ALTER JOB actions, RENAME, CREATE OR REPLACE, options."""

from __future__ import annotations

import pytest

from radixjobs import model
from radixjobs.ddl import is_job_statement, parse_job_statement
from radixjobs.errors import ParseError


def test_run_job_and_range() -> None:
    assert parse_job_statement("RUN JOB app.x;") == model.RunJob(model.QualifiedName("app", "x"))
    stmt = parse_job_statement("run job app.x for range timestamp '2026-01-01' to timestamp '2026-01-02T00:00:00Z'")
    assert isinstance(stmt, model.RunJob)
    assert (stmt.range_from_ns, stmt.range_to_ns) == (1767225600 * 10**9, 1767312000 * 10**9)
    assert is_job_statement("  -- c\n RUN JOB a.b")
    with pytest.raises(ParseError, match="the range's end must be after its start"):
        parse_job_statement("RUN JOB a.b FOR RANGE TIMESTAMP '2026-01-02' TO TIMESTAMP '2026-01-01'")


def test_alter_actions_combine() -> None:
    stmt = parse_job_statement("ALTER JOB a.b SET SCHEDULE CRON '0 3 * * *', SET RUN AS ops, "
                               "SET CALL a.p(n => 1), SET (timeout = '1 hour', history = 10), RESET (coalesce, batch), "
                               "DISABLE")
    assert isinstance(stmt, model.AlterJob)
    assert stmt.schedule == model.CronSchedule("0 3 * * *", "UTC")
    assert (stmt.principal, stmt.procedure, stmt.enabled) == ("ops", model.QualifiedName("a", "p"), False)
    assert stmt.arguments[0].name == "n"
    assert dict(stmt.options) == {"timeout": 3_600_000, "history": 10}
    assert stmt.reset == ("coalesce", "batch")


def test_alter_time_zone_option_applies_to_the_new_cron_schedule() -> None:
    stmt = parse_job_statement("ALTER JOB a.b SET SCHEDULE CRON '0 3 * * *', SET (time_zone = 'Europe/Berlin')")
    assert isinstance(stmt, model.AlterJob)
    assert stmt.schedule == model.CronSchedule("0 3 * * *", "Europe/Berlin")
    assert stmt.options == ()


def test_rename_and_replace() -> None:
    assert parse_job_statement("ALTER JOB a.b RENAME TO c.d") == model.AlterJob(
        model.QualifiedName("a", "b"), rename_to=model.QualifiedName("c", "d"))
    stmt = parse_job_statement("CREATE OR REPLACE JOB a.b SCHEDULE EVERY INTERVAL '1 hour' RUN AS r CALL a.p() "
                               "WITH (max_attempts = 2, coalesce = off, batch = ON) DISABLE")
    assert isinstance(stmt, model.CreateJob)
    assert (stmt.or_replace, stmt.enabled, dict(stmt.options)) == (True, False, {"max_attempts": 2, "coalesce": "off",
                                                                                  "batch": "on"})
    with pytest.raises(ParseError, match=r"expected .;. or end of statement"):  # RENAME stands alone
        parse_job_statement("ALTER JOB a.b RENAME TO c.d, DISABLE")


@pytest.mark.parametrize(("text", "message"), [
    ("ALTER JOB a.b SET (history = 100001)", "history must be an integer from 1 to 100000"),
    ("ALTER JOB a.b SET (coalesce = maybe)", "coalesce must be on or off"),
    ("ALTER JOB a.b SET (time_zone = 'Mars/Olympus')", "time zone"),
    ("ALTER JOB a.b RESET (nope)", 'unknown option "nope"'),
    ("ALTER JOB a.b SET RUN AS a.b", "cannot be schema-qualified"),
    ("ALTER JOB a.b SET NOTHING", r"expected SCHEDULE, RUN AS, CALL or '\(' after SET"),
    ("ALTER JOB a.b SET (history = 5), SET (max_attempts = 2)", "changed more than once"),
])
def test_alter_refusals(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_job_statement(text)
