"""Lease renewal with real daemons: a job longer than several leases is never taken over while its node
lives, and is taken over promptly once that node is SIGKILLed (issue #12 §2)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import Run
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.support import wait_for

LEASE = ("--lease-seconds", "6")  # renewed every 2 s: a renewal may come up to 4 s late on a loaded machine


def _nap_job(app: App) -> str:
    """A job whose attempt sleeps app.nap.s seconds (the test changes it while the attempt runs)."""
    app.conn.execute(f"""
        CREATE TABLE app.nap (s float8);
        INSERT INTO app.nap VALUES (24);
        GRANT SELECT ON app.nap TO {app.principal};
        CREATE PROCEDURE app.nap() LANGUAGE plpgsql AS $$
        BEGIN
          CALL app.record('nap');
          PERFORM pg_sleep((SELECT s FROM app.nap));
        END $$""")
    return app.job("CREATE JOB app.nap SCHEDULE AT TIMESTAMP '2000-01-01 00:00:00+00' RUN AS {p} "
                   "CALL app.nap() WITH (timeout = '5 minutes')")


def _running(app: App) -> dict[str, Any] | None:
    row = app.conn.execute("SELECT lease_node, lease_expires_at > clock_timestamp() AS live FROM radix.job_overview "
                           "WHERE status = 'running' AND EXISTS (SELECT 1 FROM pg_stat_activity WHERE "
                           "query LIKE '%%CALL%%nap%%' AND state = 'active' AND wait_event = 'PgSleep')").fetchone()
    return None if row is None else {"node": row[0], "live": row[1]}


@pytest.mark.timeout(180)
def test_a_long_job_is_never_taken_over_while_its_node_lives(app: App, tmp_path: Path) -> None:
    name = _nap_job(app)
    env = {"RADIXJOBS_DSN": app.dsn}
    nodes = [Serve(tmp_path, *LEASE, env=env, name=n) for n in ("lease-a", "lease-b")]
    try:
        running = wait_for(lambda: _running(app), timeout=60, interval=0.2, message="the attempt to run")
        started = time.monotonic()
        seen_live = []
        while app.state(name)["status"] == "running":  # 24 s: four leases of 6 s
            now = _running(app)
            if now is not None:
                assert now["node"] == running["node"]
                seen_live.append(now["live"])
            assert time.monotonic() - started < 150, "the 24 s attempt never ended"
            time.sleep(0.5)
        assert app.state(name)["status"] == "complete"
        assert time.monotonic() - started > 18  # it did run past several leases
        assert seen_live
        assert all(seen_live)  # renewed every 2 s: never expired while it ran
    finally:
        for node in nodes:
            node.stop()
    history = app.history(name)
    assert [h["status"] for h in history] == ["succeeded"]
    assert [e[1] for e in app.effects()] == ["nap"]


@pytest.mark.timeout(180)
def test_a_long_job_is_taken_over_promptly_when_its_node_is_killed(app: App, tmp_path: Path) -> None:
    name = _nap_job(app)
    app.conn.execute("UPDATE app.nap SET s = 600")
    env = {"RADIXJOBS_DSN": app.dsn}
    nodes = {n: Serve(tmp_path, *LEASE, env=env, name=n) for n in ("lease-a", "lease-b")}
    try:
        running = wait_for(lambda: _running(app), timeout=60, interval=0.2, message="the attempt to run")
        app.conn.execute("UPDATE app.nap SET s = 0")  # the next attempt finishes at once
        victim = running["node"]
        nodes[victim].signal(signal.SIGKILL)
        nodes[victim].wait()
        # its 6 s lease expires unrenewed and the other node takes the job over (within 100 s, however loaded
        # the machine; the attempt it killed would have slept 600 s)
        wait_for(lambda: app.state(name)["status"] == "complete", timeout=100, interval=0.2,
                 message="the other node to take the job over")
    finally:
        for node in nodes.values():
            node.stop()
    history = app.history(name)
    assert [h["status"] for h in history] == ["lease_lost", "succeeded"]
    survivor = next(n for n in nodes if n != victim)
    assert [h["node"] for h in history] == [victim, survivor]
    assert [e[1] for e in app.effects()] == ["nap"]  # the killed attempt's effect was rolled back


def test_cli_timeout_option_show_and_lease_flag(cli: Run, roles: Any) -> None:
    worker = roles("worker")
    made = cli("sql", "-c", f"""
        CREATE SCHEMA ops;
        GRANT USAGE ON SCHEMA ops TO {worker};
        CREATE PROCEDURE ops.backup() LANGUAGE sql AS $$ SELECT 1 $$;
        GRANT EXECUTE ON PROCEDURE ops.backup() TO {worker};
        CREATE JOB ops.backup SCHEDULE AT TIMESTAMP '2020-01-01T00:00:00Z' RUN AS {worker} CALL ops.backup()
          WITH (timeout = '2 hours');""")
    assert made.returncode == 0, made.stderr
    shown = cli("jobs", "show", "ops.backup")
    assert shown.returncode == 0, shown.stderr
    assert "2 hours" in shown.stdout
    assert json.loads(cli("jobs", "show", "ops.backup", "--json").stdout)["deadline_ms"] == 7_200_000

    ran = cli("run", "--once", "--lease-seconds", "30", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["attempts"] == 1
    shown = json.loads(cli("jobs", "show", "ops.backup", "--json").stdout)
    assert (shown["status"], shown["next_run_at"]) == ("complete", None)

    assert cli("run", "--once", "--lease-seconds", "1").returncode != 0
    bad = cli("sql", "-c", f"CREATE JOB ops.x SCHEDULE EVERY INTERVAL '1 hour' RUN AS {worker} CALL ops.backup() "
                           "WITH (retries = 3)")
    assert bad.returncode != 0
    assert 'unknown option "retries"' in bad.stderr
    assert "Traceback" not in bad.stderr
    fast = cli("sql", "-c", f"CREATE JOB ops.y SCHEDULE EVERY INTERVAL '1 millisecond' RUN AS {worker} "
                            "CALL ops.backup()")
    assert fast.returncode != 0
    assert "minimum of 1 second" in fast.stderr
