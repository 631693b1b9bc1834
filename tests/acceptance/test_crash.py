"""SIGKILL of an engine process at every point of an attempt: the tick resumes, atomic effects exist once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.apps import App, run_engine
from tests.support import wait_for

pytestmark = pytest.mark.versions


def _start(app: App, point: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    marker = tmp_path / "reached"
    proc = subprocess.Popen([sys.executable, "-m", "tests.acceptance.crash_runner", app.dsn, point, str(marker)])
    wait_for(lambda: marker.exists() or proc.poll() is not None, timeout=60, message=f"pause point {point}")
    assert proc.poll() is None, "the runner exited before its pause point"
    return proc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _resume(app: App) -> Any:
    """Run a healthy node until the killed node's claim has been resumed and finished."""
    engines = []

    def resumed() -> bool:
        engines.append(run_engine(app.dsn, lambda e: e.run_due(), node_id="survivor"))
        row = app.conn.execute("SELECT status FROM radix.radix_system_job_state").fetchone()
        return row is not None and row[0] == "complete"

    wait_for(resumed, timeout=60, interval=0.2, message="the tick to be resumed")
    return engines


@pytest.mark.parametrize("point", ["claimed", "executed"])
def test_atomic_tick_survives_sigkill(app: App, tmp_path: Path, point: str) -> None:
    name = app.job("CREATE JOB app.k SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('k')")
    key = f"{app.state(name)['job_id']}/1577836800000000000"
    _kill(_start(app, point, tmp_path))
    _resume(app)
    effects = app.effects()
    assert len(effects) == 1  # exactly once, wherever the crash happened
    assert effects[0][6] == key
    history = app.history(name)
    assert {h["idempotency_key"] for h in history} == {key}
    assert history[-1]["status"] == "succeeded"


def test_crash_inside_the_procedure(app: App, tmp_path: Path) -> None:
    app.conn.execute(f"CREATE TABLE app.go (x int); GRANT SELECT ON app.go TO {app.principal}")
    app.conn.execute("""CREATE PROCEDURE app.slow() LANGUAGE plpgsql AS $$
        BEGIN
          CALL app.record('inside');
          IF NOT EXISTS (SELECT 1 FROM app.go) THEN PERFORM pg_sleep(3600); END IF;
        END $$""")
    name = app.job("CREATE JOB app.s SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.slow()")
    marker = tmp_path / "reached"
    proc = subprocess.Popen([sys.executable, "-m", "tests.acceptance.crash_runner", app.dsn, "never", str(marker)])
    wait_for(lambda: app.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%CALL%%slow%%' "
                                      "AND state = 'active' AND wait_event = 'PgSleep'").fetchone() == (1,),
             timeout=60, message="the CALL")
    _kill(proc)
    app.conn.execute("INSERT INTO app.go VALUES (1)")
    # the orphaned backend notices its client is gone and rolls back; another node resumes the tick
    _resume(app)
    assert [e[1] for e in app.effects()] == ["inside"]  # the killed attempt's insert was rolled back
    history = app.history(name)
    # a tick killed in its first second wrote nothing (one transaction): only the resumed run is in the
    # history; one published as a lease before the kill (engine/ticks.py) left a 'lease_lost' row first
    assert [h["status"] for h in history] in (["succeeded"], ["lease_lost", "succeeded"])
    assert {h["attempt"] for h in history} == {1}
    assert {h["idempotency_key"] for h in history} == {f"{app.state(name)['job_id']}/1577836800000000000"}


def test_a_batch_killed_inside_a_procedure_commits_none_of_its_ticks(app: App, tmp_path: Path) -> None:
    app.conn.execute(f"CREATE TABLE app.go (x int); GRANT SELECT ON app.go TO {app.principal}")
    app.conn.execute("""CREATE PROCEDURE app.part(tag text) LANGUAGE plpgsql AS $$
        BEGIN
          CALL app.record(tag);
          IF tag = 't2' AND NOT EXISTS (SELECT 1 FROM app.go) THEN PERFORM pg_sleep(3600); END IF;
        END $$""")
    tags = ["lead", *(f"t{i}" for i in range(5))]
    for day, tag in enumerate(tags, 1):  # the lead runs alone, then t0 ... t4 in one batch (engine/batches.py)
        app.job(f"CREATE JOB app.{tag} SCHEDULE AT TIMESTAMP '2020-01-0{day}' RUN AS {{p}} CALL app.part('{tag}') "
                f"WITH (batch = on)")
    proc = subprocess.Popen([sys.executable, "-m", "tests.acceptance.crash_runner", app.dsn, "batch",
                             str(tmp_path / "reached")])
    wait_for(lambda: app.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%radix.run_ticks(%%' "
                                      "AND state = 'active' AND wait_event = 'PgSleep'").fetchone() == (1,),
             timeout=60, message="the batch's third tick")
    _kill(proc)
    app.conn.execute("INSERT INTO app.go VALUES (1)")
    # the orphaned backend rolls the whole batch back (t0 and t1 with it); another node runs each tick
    def all_run() -> bool:
        run_engine(app.dsn, lambda e: e.run_due(), node_id="survivor")
        return app.conn.execute("SELECT count(*) FILTER (WHERE status <> 'complete') FROM "
                                "radix.radix_system_job_state").fetchone() == (0,)

    wait_for(all_run, timeout=60, interval=0.2, message="every tick to be run")
    assert sorted(e[1] for e in app.effects() if e[1] != "lead") == ["t0", "t1", "t2", "t3", "t4"]
    assert [e[1] for e in app.effects()].count("lead") == 1
    assert all([h["status"] for h in app.history(f"app.{t}")] == ["succeeded"] for t in tags)


def test_non_atomic_crash_after_commit_repeats_and_once_dedupes(app: App, tmp_path: Path) -> None:
    app.conn.execute("""CREATE PROCEDURE app.nc() LANGUAGE plpgsql AS $$
        BEGIN
          IF radix.once() THEN CALL app.record('deduplicated'); END IF;
          COMMIT;
          CALL app.record('at least once');
        END $$""")
    name = app.job("CREATE JOB app.nc SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.nc()")
    _kill(_start(app, "executed", tmp_path))
    _resume(app)
    assert sorted(e[1] for e in app.effects()) == ["at least once", "at least once", "deduplicated"]
    assert app.state(name)["non_atomic"] is False or app.state(name)["status"] == "complete"
