"""Hooks on failure (``WITH (on_failure = 'app.alert')``): admission of the hook procedure, one hook per terminal
failure (after the retries) run as the job's principal with the failure document, no hook of a hook, the
hook kept across DISABLE and dropped by RESET, and the radix_events notification of the failure."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from radixjobs import catalog
from tests.apps import App
from tests.support import wait_for

HOOK_SQL = """
CREATE TABLE app.alerts (id bigserial PRIMARY KEY, doc jsonb, who text, sess text, job uuid, key text);
GRANT INSERT, SELECT ON app.alerts TO {p};
GRANT USAGE ON SEQUENCE app.alerts_id_seq TO {p};
CREATE PROCEDURE app.alert(failure jsonb) LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO app.alerts (doc, who, sess, job, key)
  VALUES (failure, current_user, session_user, radix.current_job_id(), radix.current_idempotency_key());
END $$;
GRANT EXECUTE ON PROCEDURE app.alert(jsonb) TO {p};
CREATE PROCEDURE app.boom() LANGUAGE plpgsql AS $$
BEGIN
  CALL app.record('boom');
  RAISE EXCEPTION 'the job failed' USING ERRCODE = '22012';
END $$;
CREATE PROCEDURE app.flaky() LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'try again' USING ERRCODE = '40001';
END $$;
CREATE PROCEDURE app.bad_alert(failure jsonb) LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'the alert failed too' USING ERRCODE = '22012';
END $$;
"""


@pytest.fixture
def hooks(app: App) -> App:
    app.conn.execute(HOOK_SQL.replace("{p}", app.principal))
    return app


def _alerts(app: App) -> list[dict[str, Any]]:
    with app.conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT doc, who, sess, job, key FROM app.alerts ORDER BY id").fetchall()


def _run_until(app: App, done: Any, message: str) -> None:
    """Run everything due, again and again, until ``done()``: the hook is due right after the failure."""
    wait_for(lambda: app.run() is not None and done(), timeout=60, interval=0.05, message=message)


def _history(app: App, name: str) -> list[tuple[str, str, int, int]]:
    return [(h["run_kind"], h["status"], h["planned_ns"], h["attempt"]) for h in app.history(name)]


def test_a_terminal_failure_runs_its_hook_once_as_the_principal_with_the_failure_document(hooks: App) -> None:
    app = hooks
    name = app.job("CREATE JOB app.f SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.boom() "
                   "WITH (max_attempts = 1, on_failure = 'app.alert')")
    job_id = app.state(name)["job_id"]
    tick = 1577836800 * 10**9
    _run_until(app, lambda: len(_alerts(app)) == 1, "the hook")
    app.run()  # nothing more is owed
    (alert,) = _alerts(app)
    doc = alert["doc"]
    assert (alert["who"], alert["sess"], alert["job"]) == (app.principal, app.principal, job_id)
    assert alert["key"] == f"{job_id}/{tick}"  # the failed tick's idempotency key
    assert {k: doc[k] for k in ("job", "job_id", "planned_ns", "idempotency_key", "run_kind", "attempt",
                                "max_attempts", "status")} == {
        "job": "app.f", "job_id": str(job_id), "planned_ns": tick, "idempotency_key": f"{job_id}/{tick}",
        "run_kind": "schedule", "attempt": 1, "max_attempts": 1, "status": "failed"}
    assert doc["planned_at"].startswith("2020-01-01T00:00:00")
    assert doc["error"]["sqlstate"] == "22012"
    assert doc["error"]["category"]
    assert set(doc["error"]) == {"category", "kind", "sqlstate", "message"}
    assert _history(app, name) == [("schedule", "failed", tick, 1), ("on_failure", "succeeded", tick, 1)]
    state = app.state(name)
    assert (state["status"], state["request_kind"], state["queued_runs"]) == ("failed", None, 0)
    assert state["last_error"]["sqlstate"] == "22012"  # the job's failure, as before its hook ran
    assert app.effects() == []  # the failed attempt rolled back


def test_retries_come_first_then_one_hook(hooks: App) -> None:
    app = hooks
    name = app.job("CREATE JOB app.f SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.flaky() "
                   "WITH (max_attempts = 3, on_failure = 'app.alert')")

    def retried() -> bool:
        app.make_due(name)  # the backoff, skipped
        return len(_alerts(app)) == 1

    _run_until(app, retried, "three attempts and the hook")
    assert [(k, s, a) for k, s, _, a in _history(app, name)] == [
        ("schedule", "retrying", 1), ("schedule", "retrying", 2), ("schedule", "failed", 3),
        ("on_failure", "succeeded", 1)]
    assert _alerts(app)[0]["doc"]["attempt"] == 3


def test_a_failing_hook_queues_no_hook_and_leaves_the_job_s_error(hooks: App) -> None:
    app = hooks
    name = app.job("CREATE JOB app.f SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.boom() "
                   "WITH (max_attempts = 1, on_failure = 'app.bad_alert')")
    _run_until(app, lambda: [s for k, s, _, _ in _history(app, name) if k == "on_failure"] == ["failed"],
               "the hook to fail")
    app.run()
    assert [(k, s) for k, s, _, _ in _history(app, name)] == [("schedule", "failed"), ("on_failure", "failed")]
    state = app.state(name)
    assert (state["status"], state["queued_runs"]) == ("failed", 0)
    assert state["last_error"]["message"] != "the alert failed too"
    assert state["non_atomic"] is False


def test_an_every_job_owes_one_hook_per_failed_tick_and_keeps_its_schedule(hooks: App) -> None:
    app = hooks
    name = app.job("CREATE JOB app.f SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.boom() "
                   "WITH (max_attempts = 1, on_failure = 'app.alert')")
    for n in (1, 2):
        app.make_due(name)
        _run_until(app, lambda n=n: len(_alerts(app)) == n, f"hook {n}")
    ticks = [a["doc"]["planned_ns"] for a in _alerts(app)]
    assert ticks[0] < ticks[1]
    state = app.state(name)
    assert (state["status"], state["request_kind"]) == ("scheduled", None)
    assert state["planned_ns"] > ticks[1]  # the regular tick, put back after the hook


def test_a_hook_owed_survives_disable_and_reset_drops_it(hooks: App) -> None:
    app = hooks
    name = app.job("CREATE JOB app.f SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.boom() "
                   "WITH (max_attempts = 1, on_failure = 'app.alert')")
    app.make_due(name)
    # the failure alone (the hook is queued in its transaction): record it without running the hook
    app.conn.execute("SELECT radix.register_node('n', 'localhost', 0)")
    (job_id, token) = app.conn.execute("SELECT job_id, lease_token FROM radix.claim_due('n', 10)").fetchone()
    error = {"category": "application", "kind": "division_by_zero", "sqlstate": "22012", "message": "x"}
    app.conn.execute("SELECT radix.finish_attempt(%s, %s, 'failed', %s, 0, NULL, true, false)",
                     (job_id, token, psycopg.types.json.Jsonb(error)))
    assert app.state(name)["request_kind"] == "on_failure"  # promoted at once
    catalog.execute_job_ddl(app.conn, f"ALTER JOB {name} DISABLE")
    state = app.state(name)
    assert (state["status"], state["request_kind"]) == ("scheduled", "on_failure")  # installed again: it runs
    _run_until(app, lambda: len(_alerts(app)) == 1, "the hook of a disabled job")
    assert app.state(name)["status"] == "disabled"
    # owed again, then RESET (on_failure): no longer owed
    app.conn.execute("INSERT INTO radix.job_requests (job_id, planned_ns, kind, requested_by, detail) "
                     "VALUES (%s, 1, 'on_failure', 'x', '{}')", (job_id,))
    catalog.execute_job_ddl(app.conn, f"ALTER JOB {name} RESET (on_failure)")
    assert app.conn.execute("SELECT count(*) FROM radix.job_requests").fetchone() == (0,)
    assert app.state(name)["on_failure"] is None


def test_the_principal_without_execute_on_the_hook_is_refused_at_run_time(hooks: App) -> None:
    app = hooks
    app.conn.execute(f"REVOKE EXECUTE ON PROCEDURE app.alert(jsonb) FROM PUBLIC, {app.principal}")
    name = app.job("CREATE JOB app.f SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.boom() "
                   "WITH (max_attempts = 1, on_failure = 'app.alert')")
    _run_until(app, lambda: any(k == "on_failure" and s == "failed" for k, s, _, _ in _history(app, name)),
               "the hook refused")
    (hook,) = [h for h in app.history(name) if h["run_kind"] == "on_failure"]
    assert hook["error"]["sqlstate"] == "42501"
    assert _alerts(app) == []


@pytest.mark.parametrize(("hook", "sqlstate"), [
    ("app.nothing", "42883"),  # no such procedure
    ("app.alert_fn", "42809"),  # a function
    ("app.alert_text", "42883"),  # takes text
    ("app.alert_two", "42P13"),  # a second (defaulted) argument
    ("nope", "42602"),  # not qualified
])
def test_admission_refuses_a_hook_that_is_not_a_procedure_of_one_jsonb(hooks: App, hook: str, sqlstate: str) -> None:
    app = hooks
    app.conn.execute("CREATE FUNCTION app.alert_fn(failure jsonb) RETURNS void LANGUAGE sql AS 'SELECT'; "
                     "CREATE PROCEDURE app.alert_text(failure text) LANGUAGE sql AS 'SELECT'; "
                     "CREATE PROCEDURE app.alert_two(failure jsonb, level text DEFAULT 'x') LANGUAGE sql "
                     "AS 'SELECT'")
    with pytest.raises(psycopg.Error) as caught:
        app.conn.execute("SELECT radix.create_job('app.f', '{\"every\": \"1 hour\"}', %s, 'app.record', "
                         "'[{\"kind\": \"string\", \"value\": \"x\"}]', options => %s)",
                         (app.principal, json.dumps({"on_failure": hook})))
    assert caught.value.sqlstate == sqlstate
    assert app.conn.execute("SELECT count(*) FROM radix.jobs").fetchone() == (0,)


def test_alter_sets_and_resets_the_hook_without_re_arming(hooks: App) -> None:
    app = hooks
    name = app.job("CREATE JOB app.f SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('f')")
    before = app.state(name)
    catalog.execute_job_ddl(app.conn, f"ALTER JOB {name} SET (on_failure = 'app.alert')")
    after = app.state(name)
    assert after["on_failure"] == "app.alert(jsonb)"
    assert (after["planned_ns"], after["anchor_ns"]) == (before["planned_ns"], before["anchor_ns"])
    catalog.execute_job_ddl(app.conn, f"ALTER JOB {name} RESET (on_failure)")
    assert app.state(name)["on_failure"] is None


def test_a_forged_hook_binding_is_checked_against_the_catalog(hooks: App) -> None:
    app = hooks
    app.conn.execute("CREATE PROCEDURE app.other(failure jsonb) LANGUAGE sql AS 'SELECT'")
    other = app.conn.execute("SELECT 'app.other(jsonb)'::regprocedure::oid").fetchone()
    assert other is not None
    with pytest.raises(psycopg.Error) as caught:
        app.conn.execute(
            "SELECT radix._create_job(current_user, 'app.f', '{\"every\": \"1 hour\"}', %s, 'app.record', "
            "radix._resolve_call('app', 'record', '[{\"kind\": \"string\", \"value\": \"x\"}]'), true, false, %s)",
            (app.principal, json.dumps({"on_failure": "app.alert",
                                        "on_failure_binding": {"procedure_oid": other[0]}})))
    assert caught.value.sqlstate == "22023"
