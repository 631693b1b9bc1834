"""``radixjobs sql`` runs the SCHEDULE AFTER DDL; ``jobs show`` lists a job's upstreams and dependents;
``jobs next`` says an AFTER job has no planned times of its own; ``DROP JOB`` of an upstream is refused in
one line unless CASCADE."""

from __future__ import annotations

import json
from typing import Any

from tests.acceptance.conftest import Run


def test_after_ddl_show_next_and_drop(cli: Run, roles: Any) -> None:
    worker = roles("worker")
    res = cli("sql", "-c", f"""
        CREATE SCHEMA etl;
        CREATE PROCEDURE etl.nop() LANGUAGE plpgsql AS $$ BEGIN END $$;
        CREATE JOB etl.pull SCHEDULE CRON '0 2 * * *' RUN AS {worker} CALL etl.nop();
        CREATE JOB etl.audit SCHEDULE CRON '0 2 * * *' RUN AS {worker} CALL etl.nop();
        CREATE JOB etl.load SCHEDULE AFTER etl.pull RUN AS {worker} CALL etl.nop();
        CREATE JOB etl.report SCHEDULE AFTER etl.load COMPLETES AND etl.audit RUN AS {worker} CALL etl.nop();
    """)
    assert res.returncode == 0, res.stderr
    shown = cli("jobs", "show", "etl.load")
    assert shown.returncode == 0, shown.stderr
    lines = [line.split() for line in shown.stdout.splitlines()]
    assert ["upstreams", ":", "etl.pull", "SUCCEEDS"] in lines, shown.stdout
    assert ["downstreams", ":", "etl.report", "COMPLETES"] in lines, shown.stdout
    as_json = json.loads(cli("jobs", "show", "etl.report", "--json").stdout)
    assert as_json["schedule"] == "AFTER etl.audit SUCCEEDS AND etl.load COMPLETES"
    assert [(e["job"], e["on"]) for e in as_json["upstreams"]] == [("etl.audit", "succeeds"),
                                                                   ("etl.load", "completes")]
    upcoming = cli("jobs", "next", "etl.load")
    assert upcoming.returncode != 0
    assert "has no planned times of its own" in upcoming.stderr
    assert len(upcoming.stderr.strip().splitlines()) == 1
    cycle = cli("sql", "-c", "ALTER JOB etl.pull SET SCHEDULE AFTER etl.report")
    assert cycle.returncode != 0
    assert "cannot run after a job that runs after it" in cycle.stderr
    refused = cli("sql", "-c", "DROP JOB etl.pull")
    assert refused.returncode != 0
    assert "cannot drop job etl.pull because other jobs run after it" in refused.stderr
    assert "Traceback" not in refused.stderr
    dropped = cli("sql", "-c", "DROP JOB etl.pull CASCADE")
    assert dropped.returncode == 0, dropped.stderr
    left = json.loads(cli("jobs", "list", "--json").stdout)
    assert sorted(j["name"] for j in left) == ["etl.audit"]
