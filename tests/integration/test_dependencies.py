"""Dependencies (``SCHEDULE AFTER upstream [SUCCEEDS | FAILS | COMPLETES] [AND …]``): each upstream tick that
ends as named queues one tick of the dependent with the same planned time, in the upstream's own
transaction; a fan-in runs once all its upstreams arrived; backfill flows down the chain, RUN JOB does not;
cycles are refused; DROP JOB of an upstream is RESTRICT by default and drops its dependents with CASCADE;
who may depend on whom. Engines run everything due; the tests wait for effects, never for a fixed time."""

from __future__ import annotations

import pytest

from radixjobs import catalog
from radixjobs.errors import AdmissionError, ParseError
from tests.apps import App

FAILING = """
CREATE PROCEDURE app.boom(tag text) LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'boom %', tag USING ERRCODE = '40001';
END $$"""


def _effects(app: App) -> list[tuple[str, str]]:
    """(tag, planned ns of the key) of every effect, in order."""
    rows = app.conn.execute("SELECT tag, key FROM app.effects ORDER BY id").fetchall()
    return [(tag, key.split("/")[1]) for tag, key in rows]


def _edges(edges: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(e["job"], e["on"]) for e in edges]


def _run_until_quiet(app: App, rounds: int = 12) -> None:
    """Run engines until a run finds nothing more to do (a dependent's tick is queued by its upstream's)."""
    for _ in range(rounds):
        before = app.conn.execute("SELECT count(*) FROM radix.radix_system_job_history").fetchone()
        app.run()
        after = app.conn.execute("SELECT count(*) FROM radix.radix_system_job_history").fetchone()
        queued = app.conn.execute("SELECT count(*) FROM radix.job_requests").fetchone()
        if before == after and queued == (0,):
            return
    raise AssertionError("work kept arriving")


def test_a_chain_and_a_fan_in_share_the_upstream_s_planned_time(app: App) -> None:
    a = app.job("CREATE JOB app.a SCHEDULE AT TIMESTAMP '2026-01-01' RUN AS {p} CALL app.record('a')")
    x = app.job("CREATE JOB app.x SCHEDULE AT TIMESTAMP '2026-01-01' RUN AS {p} CALL app.record('x')")
    app.job("CREATE JOB app.b SCHEDULE AFTER app.a RUN AS {p} CALL app.record('b')")
    app.job("CREATE JOB app.c SCHEDULE AFTER app.b SUCCEEDS RUN AS {p} CALL app.record('c')")
    app.job("CREATE JOB app.d SCHEDULE AFTER app.a AND app.x RUN AS {p} CALL app.record('d')")
    app.run()  # a and x: d waits for both, then b, c, d
    _run_until_quiet(app)
    tick = str(app.conn.execute("SELECT radix.to_ns('2026-01-01')").fetchone()[0])  # type: ignore[index]
    effects = _effects(app)
    assert sorted(effects) == sorted([(t, tick) for t in ("a", "x", "b", "c", "d")])
    assert [t for t, _ in effects].index("b") < [t for t, _ in effects].index("c")
    state = app.state("app.b")
    assert (state["status"], state["planned_ns"], state["due_ns"]) == ("scheduled", None, None)
    assert [h["run_kind"] for h in app.history("app.b")] == ["after"]
    assert _edges(app.state(a)["downstreams"]) == [("app.b", "succeeds"), ("app.d", "succeeds")]
    assert app.state("app.d")["schedule"] == "AFTER app.a SUCCEEDS AND app.x SUCCEEDS"
    assert app.state(x)["upstreams"] == []


def test_fails_and_completes_edges_and_a_run_job_that_runs_alone(app: App) -> None:
    app.conn.execute(FAILING)
    app.job("CREATE JOB app.up SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.boom('up') "
            "WITH (max_attempts = 2, timeout = '1 minute')")
    app.job("CREATE JOB app.on_ok SCHEDULE AFTER app.up RUN AS {p} CALL app.record('on_ok')")
    app.job("CREATE JOB app.on_fail SCHEDULE AFTER app.up FAILS RUN AS {p} CALL app.record('on_fail')")
    app.job("CREATE JOB app.on_end SCHEDULE AFTER app.up COMPLETES RUN AS {p} CALL app.record('on_end')")
    app.conn.execute("UPDATE radix.radix_system_job_state s SET due_ns = radix.to_ns(clock_timestamp()) "
                     "FROM radix.jobs j WHERE j.job_id = s.job_id AND s.status = 'retry_wait'")
    for _ in range(4):  # the first attempt, its retry after the backoff, then the dependents
        app.run()
        app.conn.execute("UPDATE radix.radix_system_job_state SET due_ns = radix.to_ns(clock_timestamp()) "
                         "WHERE status = 'retry_wait'")
    _run_until_quiet(app)
    assert [h["status"] for h in app.history("app.up")] == ["retrying", "failed"]  # terminal after its retry
    assert sorted(t for t, _ in _effects(app)) == ["on_end", "on_fail"]
    # RUN JOB of an upstream runs it alone
    catalog.execute_job_ddl(app.conn, "RUN JOB app.up")
    _run_until_quiet(app)
    app.conn.execute("UPDATE radix.radix_system_job_state SET due_ns = radix.to_ns(clock_timestamp()) "
                     "WHERE status = 'retry_wait'")
    _run_until_quiet(app)
    assert [h["status"] for h in app.history("app.up")][2:] == ["retrying", "failed"]
    assert sorted(t for t, _ in _effects(app)) == ["on_end", "on_fail"]


def test_backfill_of_an_upstream_flows_down_and_run_job_of_a_dependent_runs_alone(app: App) -> None:
    app.job("CREATE JOB app.a SCHEDULE EVERY INTERVAL '1 hour' STARTING AT TIMESTAMP '2026-01-01' "
            "RUN AS {p} CALL app.record('a')")
    app.job("CREATE JOB app.b SCHEDULE AFTER app.a RUN AS {p} CALL app.record('b')")
    app.job("CREATE JOB app.c SCHEDULE AFTER app.b RUN AS {p} CALL app.record('c')")
    catalog.execute_job_ddl(app.conn, "RUN JOB app.a FOR RANGE TIMESTAMP '2026-01-01 00:00:00+00' "
                                      "TO TIMESTAMP '2026-01-01 05:00:00+00'")
    _run_until_quiet(app)
    effects = _effects(app)
    for tag in ("a", "b", "c"):
        assert len([1 for t, _ in effects if t == tag]) == 5, effects
    assert {k for t, k in effects if t == "c"} == {k for t, k in effects if t == "a"}
    catalog.execute_job_ddl(app.conn, "RUN JOB app.b")
    _run_until_quiet(app)
    tags = [t for t, _ in _effects(app)]
    assert (tags.count("b"), tags.count("c")) == (6, 5)


def test_cycles_and_self_dependencies_are_refused(app: App) -> None:
    app.job("CREATE JOB app.a SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('a')")
    app.job("CREATE JOB app.b SCHEDULE AFTER app.a RUN AS {p} CALL app.record('b')")
    app.job("CREATE JOB app.c SCHEDULE AFTER app.b RUN AS {p} CALL app.record('c')")
    with pytest.raises(AdmissionError, match="cannot run after a job that runs after it"):
        catalog.execute_job_ddl(app.conn, "ALTER JOB app.a SET SCHEDULE AFTER app.c")
    with pytest.raises(AdmissionError, match="cannot run after itself"):
        catalog.execute_job_ddl(app.conn, "ALTER JOB app.b SET SCHEDULE AFTER app.b")
    with pytest.raises(AdmissionError, match="does not exist"):
        catalog.execute_job_ddl(app.conn, f"CREATE JOB app.d SCHEDULE AFTER app.nope RUN AS {app.principal} "
                                          "CALL app.record('d')")
    with pytest.raises(AdmissionError, match="an AFTER job has none"):
        catalog.execute_job_ddl(app.conn, "ALTER JOB app.b SET (jitter = '1 minute')")
    with pytest.raises(ParseError, match="named twice"):
        catalog.execute_job_ddl(app.conn, "CREATE JOB app.d SCHEDULE AFTER app.a AND app.a RUN AS x CALL app.r()")
    assert app.state("app.a")["schedule_kind"] == "every"
    # an upstream changed: the edges follow, the job's path too
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.c SET SCHEDULE AFTER app.a FAILS")
    assert _edges(app.state("app.c")["upstreams"]) == [("app.a", "fails")]
    assert app.state("app.b")["downstreams"] == []


def test_drop_is_restrict_by_default_and_cascade_drops_the_chain(app: App) -> None:
    app.job("CREATE JOB app.a SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('a')")
    app.job("CREATE JOB app.b SCHEDULE AFTER app.a RUN AS {p} CALL app.record('b')")
    app.job("CREATE JOB app.c SCHEDULE AFTER app.b RUN AS {p} CALL app.record('c')")
    via_lease = "SELECT s.via_lease FROM radix.radix_system_job_state s JOIN radix.jobs j USING (job_id) " \
                "WHERE j.job_name = 'a'"
    assert app.conn.execute(via_lease).fetchone() == (True,)
    with pytest.raises(AdmissionError, match="other jobs run after it"):
        catalog.execute_job_ddl(app.conn, "DROP JOB app.a")
    catalog.execute_job_ddl(app.conn, "DROP JOB app.c")
    catalog.execute_job_ddl(app.conn, "DROP JOB app.a CASCADE")
    assert app.conn.execute("SELECT count(*) FROM radix.jobs").fetchone() == (0,)
    app.job("CREATE JOB app.a SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('a')")
    app.job("CREATE JOB app.b SCHEDULE AFTER app.a RUN AS {p} CALL app.record('b')")
    catalog.execute_job_ddl(app.conn, "DROP JOB app.b")  # its upstream goes back to the one-transaction path
    assert app.conn.execute(via_lease).fetchone() == (False,)
