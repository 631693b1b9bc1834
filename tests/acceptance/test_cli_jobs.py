"""Jobs through the CLI: one script with a procedure and its job, list/show, run --once, history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.acceptance.conftest import Run


def test_script_job_run_and_history(cli: Run, tmp_path: Path, roles: Any) -> None:
    worker = roles("worker")
    script = tmp_path / "jobs.sql"
    script.write_text(f"""
        CREATE SCHEMA maintenance;
        CREATE SCHEMA auth;
        CREATE TABLE auth.sessions (id int, expired boolean DEFAULT false);
        INSERT INTO auth.sessions SELECT g FROM generate_series(1, 5) g;
        GRANT USAGE ON SCHEMA auth TO {worker};
        GRANT SELECT, UPDATE ON auth.sessions TO {worker};
        CREATE PROCEDURE auth.expire_sessions(batch_size int DEFAULT 100) LANGUAGE plpgsql AS $$
        BEGIN
          UPDATE auth.sessions SET expired = true WHERE id <= batch_size;  -- a ; inside the body
        END $$;
        -- the seed's own example, as written
        CREATE JOB maintenance.expire_sessions
        SCHEDULE EVERY INTERVAL '5 minute'
        RUN AS {worker}
        CALL auth.expire_sessions(batch_size => 3)
        ENABLE;
        CREATE JOB maintenance.once SCHEDULE AT TIMESTAMP '2020-01-01T00:00:00Z'
        RUN AS {worker} CALL auth.expire_sessions(batch_size => 1000);
    """)
    res = cli("sql", "-f", str(script))
    assert res.returncode == 0, res.stderr
    assert "CREATE JOB" in res.stdout

    listed = cli("jobs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    jobs = {j["name"]: j for j in json.loads(listed.stdout)}
    assert set(jobs) == {"maintenance.expire_sessions", "maintenance.once"}
    assert jobs["maintenance.expire_sessions"]["principal"] == worker
    assert jobs["maintenance.expire_sessions"]["procedure"] == "auth.expire_sessions(integer)"
    assert jobs["maintenance.expire_sessions"]["schedule"].startswith("EVERY 00:05:00")
    human = cli("jobs", "list")
    assert "maintenance.expire_sessions" in human.stdout
    assert "(2 rows)" in human.stdout

    shown = cli("jobs", "show", "maintenance.expire_sessions")
    assert shown.returncode == 0, shown.stderr
    assert "batch_size => \"3\"::integer" in shown.stdout

    ran = cli("run", "--once", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["attempts"] == 1  # the one-time job; the interval one is not due yet

    history = cli("jobs", "history", "maintenance.once", "--json")
    (attempt,) = json.loads(history.stdout)
    assert attempt["status"] == "succeeded"
    assert cli("sql", "--json", "-c", "select count(*) as n from auth.sessions where expired").stdout.count('"n": 5')

    missing = cli("jobs", "show", "maintenance.nope")
    assert missing.returncode != 0
    assert "does not exist" in missing.stderr
    bad = cli("sql", "-c", "CREATE JOB maintenance.x SCHEDULE EVERY INTERVAL '1 month' RUN AS x CALL a.b()")
    assert bad.returncode != 0
    assert "month" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert cli("run").returncode != 0  # neither --once nor --for
