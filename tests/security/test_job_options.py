"""Attacks through job options (sql/routines/admission.sql, deadlines.sql): a tenant that may create jobs
gives one a start deadline or jitter so large that a tick's time plus it leaves bigint, which would make the
finder, every claim and cron planning fail for every role. Through the real path: the tenant's own
connection calling the public SQL functions, then an engine running another owner's job."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import errors, sql

from tests.apps import App

HUGE = '"100000 days"'  # 8.64e18 ns: fits a bigint alone, not added to a tick's time


@pytest.mark.parametrize(("schedule", "option"), [('{"every": "1 hour"}', "start_deadline"),
                                                  ('{"cron": "* * * * * *"}', "jitter"),
                                                  ('{"cron": "* * * * * *"}', "start_deadline")])
def test_an_option_past_bigint_is_refused_and_scheduling_goes_on(app: App, roles: Any, login: Any, schedule: str,
                                                                 option: str) -> None:
    tenant = roles("tenant")
    app.conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA app TO {0}; GRANT {1} TO {0}").format(
        sql.Identifier(tenant), sql.Identifier(app.principal)))
    conn = login(tenant)
    create = ("SELECT radix.create_job('app.bomb', %s::jsonb, %s::text, 'app.record', "
              "'[{\"kind\": \"string\", \"value\": \"bomb\"}]'::jsonb, options => %s::jsonb)")
    with pytest.raises(errors.InvalidParameterValue, match="must be at most 100 years"):
        conn.execute(create.encode(), (schedule, app.principal, f'{{"{option}": {HUGE}}}'))
    conn.execute(create.encode(), (schedule, app.principal, "{}"))
    with pytest.raises(errors.InvalidParameterValue, match="must be at most 100 years"):
        conn.execute(f"SELECT radix.alter_job('app.bomb', options => '{{\"{option}\": {HUGE}}}')".encode())
    row = app.conn.execute("SELECT start_deadline_ns, jitter_ns FROM radix.jobs WHERE job_name = 'bomb'").fetchone()
    assert row == (None, None)
    # another owner's job still runs
    app.job("CREATE JOB app.victim SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('victim')")
    app.run()
    assert "victim" in [e[1] for e in app.effects()]
