"""``radixjobs sql`` runs the job group DDL; ``jobs show`` shows a job's group; ``jobs groups`` lists them."""

from __future__ import annotations

import json
from typing import Any

from tests.acceptance.conftest import Run


def test_group_ddl_show_and_list(cli: Run, roles: Any) -> None:
    worker = roles("worker")
    res = cli("sql", "-c", f"""
        CREATE SCHEMA ops;
        CREATE PROCEDURE ops.nop() LANGUAGE plpgsql AS $$ BEGIN END $$;
        CREATE JOB GROUP etl WITH (max_running = 2);
        CREATE JOB ops.a SCHEDULE EVERY INTERVAL '1 hour' RUN AS {worker} CALL ops.nop() WITH (group = etl);
        ALTER JOB GROUP etl SET (max_running = 3);
    """)
    assert res.returncode == 0, res.stderr
    assert "CREATE JOB GROUP" in res.stdout
    shown = cli("jobs", "show", "ops.a")
    assert shown.returncode == 0, shown.stderr
    assert ["group", ":", "etl"] in [line.split() for line in shown.stdout.splitlines()], shown.stdout
    listed = cli("jobs", "groups", "--json")
    assert listed.returncode == 0, listed.stderr
    (group,) = json.loads(listed.stdout)
    assert (group["name"], group["max_running"], group["jobs"], group["running"]) == ("etl", 3, 1, 0)
    refused = cli("sql", "-c", "DROP JOB GROUP etl")
    assert refused.returncode != 0
    assert "cannot drop job group etl because 1 job(s) are in it: ops.a" in refused.stderr
    assert "Traceback" not in refused.stderr
