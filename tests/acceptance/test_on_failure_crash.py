"""An on_failure hook runs exactly once per terminal failure across a SIGKILL of the ``radixjobs serve`` that ran
it, whether the daemon dies inside the failing attempt or inside the hook; radix_events (to a LISTENer of any
role) and --notify-url (to a loopback receiver) deliver the failure's event."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.acceptance.serving import Serve
from tests.apps import App
from tests.support import wait_for
from tests.webhook import Receiver

TICK_NS = 1577836800 * 10**9

SETUP = """
CREATE TABLE app.go (x int);
GRANT SELECT ON app.go TO {p};
CREATE TABLE app.alerts (id bigserial PRIMARY KEY, doc jsonb);
GRANT INSERT ON app.alerts TO {p};
GRANT USAGE ON SEQUENCE app.alerts_id_seq TO {p};
CREATE PROCEDURE app.boom() LANGUAGE plpgsql AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM app.go) THEN PERFORM pg_sleep(3600); END IF;
  RAISE EXCEPTION 'the job failed' USING ERRCODE = '22012';
END $$;
CREATE PROCEDURE app.alert(failure jsonb) LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO app.alerts (doc) VALUES (failure);
  IF NOT EXISTS (SELECT 1 FROM app.go WHERE x = 2) THEN PERFORM pg_sleep(3600); END IF;
END $$;
"""


def _sleeping_in(app: App, procedure: str) -> bool:
    row = app.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND state = 'active' "
                           "AND wait_event = 'PgSleep'", (f"%CALL \"app\".\"{procedure}\"%",)).fetchone()
    return row == (1,)


def _history(app: App) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in app.conn.execute(
        "SELECT run_kind, status FROM radix.radix_system_job_history ORDER BY history_id")]


@pytest.mark.parametrize("point", ["job", "hook"])
def test_on_failure_runs_once_across_a_daemon_kill(app: App, roles: Any, tmp_path: Path, point: str) -> None:
    app.conn.execute(SETUP.replace("{p}", app.principal))
    app.job("CREATE JOB app.f SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.boom() "
            "WITH (max_attempts = 1, on_failure = 'app.alert')")
    job_id = str(app.conn.execute("SELECT job_id FROM radix.jobs").fetchone()[0])  # type: ignore[index]
    if point == "hook":  # the job fails at once; the daemon dies inside its hook
        app.conn.execute("INSERT INTO app.go VALUES (1)")
    stranger = roles("stranger")  # any role may LISTEN on any channel
    with Receiver() as receiver, psycopg.connect(make_conninfo(app.dsn, user=stranger),
                                                 autocommit=True) as listener:
        listener.execute("LISTEN radix_events")
        env = {"RADIXJOBS_DSN": app.dsn}
        doomed = Serve(tmp_path, "--notify-url", receiver.url, env=env, name="doomed")
        survivor = None
        try:
            wait_for(lambda: _sleeping_in(app, "boom" if point == "job" else "alert"), timeout=60,
                     message=f"the daemon inside the {point}")
            if point == "hook":  # the failure's event reached the webhook before the kill
                wait_for(lambda: len(receiver.bodies) == 1, timeout=60, message="the webhook")
            doomed.signal(signal.SIGKILL)
            doomed.wait()
            app.conn.execute("INSERT INTO app.go VALUES (1), (2)")
            survivor = Serve(tmp_path, "--notify-url", receiver.url, env=env, name="survivor")
            wait_for(lambda: ("on_failure", "succeeded") in _history(app), timeout=60, message="the hook")
            wait_for(lambda: len(receiver.bodies) >= 1, timeout=60, message="the webhook")
            survivor.signal(signal.SIGTERM)
            assert survivor.wait() == 0
        finally:
            doomed.stop()
            if survivor is not None:
                survivor.stop()
        events = [json.loads(n.payload) for n in listener.notifies(timeout=60, stop_after=1)]
    alerts = app.conn.execute("SELECT doc FROM app.alerts").fetchall()
    assert len(alerts) == 1  # exactly once: the killed attempt (of the job or of its hook) rolled back
    assert (alerts[0][0]["job"], alerts[0][0]["planned_ns"]) == ("app.f", TICK_NS)
    history = _history(app)
    assert history.count(("schedule", "failed")) == 1
    assert history.count(("on_failure", "succeeded")) == 1
    assert set(history) <= {("schedule", "failed"), ("schedule", "lease_lost"), ("on_failure", "succeeded"),
                            ("on_failure", "lease_lost")}
    expected = {"job_id": job_id, "status": "failed", "run_kind": "schedule", "category": events[0]["category"],
                "attempt": 1, "planned_ns": TICK_NS}
    assert events == [expected]  # no name, no argument, no error text
    (body,) = receiver.bodies
    assert {k: body[k] for k in expected} == expected
    assert (body["job"], body["database"], body["event"]) == ("app.f", app.conn.info.dbname, "job_failed")
