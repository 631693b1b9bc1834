"""The lifecycle verbs through the CLI: ALTER ... SET / RENAME and RUN JOB in `sql`, `jobs show` options,
`jobs run --wait` (with an engine running beside it) and `jobs run --from/--to` (a backfill)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.acceptance.conftest import Run


def _setup(cli: Run, roles: Any, body: str = "INSERT INTO app.runs DEFAULT VALUES") -> str:
    worker = roles("worker")
    res = cli("sql", "-c", f"""
        CREATE SCHEMA app;
        CREATE TABLE app.runs (id serial PRIMARY KEY, at timestamptz DEFAULT clock_timestamp());
        GRANT USAGE ON SCHEMA app TO {worker};
        GRANT INSERT ON app.runs TO {worker};
        GRANT USAGE ON SEQUENCE app.runs_id_seq TO {worker};
        CREATE PROCEDURE app.work() LANGUAGE plpgsql AS $$ BEGIN {body}; END $$;
        CREATE JOB app.job SCHEDULE EVERY INTERVAL '1 day' RUN AS {worker} CALL app.work() DISABLE;
    """)
    assert res.returncode == 0, res.stderr
    return worker


def test_alter_set_rename_and_show(cli: Run, roles: Any) -> None:
    _setup(cli, roles)
    res = cli("sql", "-c", "ALTER JOB app.job SET (timeout = '2 hours', max_attempts = 2, coalesce = off, batch = on, "
                           "start_deadline = '10 minutes', jitter = '30 seconds'), "
                           "SET SCHEDULE CRON '0 3 * * *'", "-c", "ALTER JOB app.job RENAME TO app.nightly")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["ALTER JOB", "ALTER JOB"]
    shown = cli("jobs", "show", "app.nightly")
    assert shown.returncode == 0, shown.stderr
    for line in ("timeout", "2 hours"), ("max_attempts", "2"), ("coalesce", "off"), ("batch", "on"), \
                ("history", "256"), ("time_zone", "UTC"), ("start_deadline", "10 minutes"), ("jitter", "30 seconds"):
        assert any(line[0] in row and row.rstrip().endswith(line[1]) for row in shown.stdout.splitlines()), line
    bad = cli("sql", "-c", "ALTER JOB app.nightly SET (history = 0)")
    assert bad.returncode == 1
    assert "history must be an integer from 1 to 100000" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    bad = cli("sql", "-c", "ALTER JOB app.nightly SET SCHEDULE EVERY INTERVAL '10 seconds'")
    assert bad.returncode == 1
    assert "option jitter must be less than the schedule's interval" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_jobs_run_wait_reports_the_outcome(cli: Run, roles: Any, db: str) -> None:
    _setup(cli, roles)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"RADIXJOBS_DSN": db}
    engine = subprocess.Popen([sys.executable, "-m", "radixjobs", "run", "--for", "600"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        res = cli("jobs", "run", "app.job", "--wait", "--json", timeout=90)
        assert res.returncode == 0, res.stderr
        outcome = json.loads(res.stdout)
        assert (outcome["status"], outcome["run_kind"]) == ("succeeded", "run")
        cli("sql", "-c", "CREATE OR REPLACE PROCEDURE app.work() LANGUAGE plpgsql AS $$ BEGIN "
                         "RAISE EXCEPTION 'broken on purpose'; END $$")
        failed = cli("jobs", "run", "app.job", "--wait", timeout=90)
        assert failed.returncode == 1
        assert "failed" in failed.stdout
        assert "broken on purpose" in failed.stdout
    finally:
        engine.terminate()
        engine.wait(30)
    history = json.loads(cli("jobs", "history", "app.job", "--json").stdout)
    assert [h["status"] for h in history] == ["failed", "succeeded"]


def test_jobs_run_backfill_and_refusals(cli: Run, roles: Any) -> None:
    _setup(cli, roles)
    res = cli("sql", "-c", "ALTER JOB app.job SET SCHEDULE EVERY INTERVAL '1 hour' STARTING AT TIMESTAMP "
                           "'2026-01-01T00:00:00Z'")
    assert res.returncode == 0, res.stderr
    queued = cli("jobs", "run", "app.job", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T06:00:00Z", "--json")
    assert queued.returncode == 0, queued.stderr
    assert json.loads(queued.stdout)["queued"] == 6  # STARTING AT is a tick: 00:00 … 05:00
    ran = cli("run", "--once", "--json")
    assert ran.returncode == 0, ran.stderr
    half = cli("jobs", "run", "app.job", "--from", "2026-01-01T00:00:00Z")
    assert half.returncode == 2
    assert "both --from and --to" in half.stderr
    missing = cli("jobs", "run", "app.nope")
    assert missing.returncode == 1
    assert "does not exist" in missing.stderr
