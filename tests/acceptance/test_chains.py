"""A chain ``a → b → c`` and a fan-in ``(a AND x) → d`` under a real SIGKILL of an engine process between
``a``'s commit and ``b``'s start, then scheduled ticks and a backfill: every dependent runs exactly once per
planned time its upstreams ended at, with that planned time (atomic procedures)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from radixjobs import catalog
from tests.apps import App, Background
from tests.support import wait_for

SECOND = 1_000_000_000


def _planned(app: App, tag: str) -> Counter[int]:
    """How many effects ``tag`` has at each planned time (its idempotency key's)."""
    return Counter(int(key.split("/")[1]) for (key,) in
                   app.conn.execute("SELECT key FROM app.effects WHERE tag = %s", (tag,)).fetchall())


def _succeeded(app: App, name: str) -> set[int]:
    return {h["planned_ns"] for h in app.history(name) if h["status"] == "succeeded"}


def _quiet(app: App) -> bool:
    """Nothing queued, due or running for the dependents."""
    return app.conn.execute(
        "SELECT NOT EXISTS (SELECT 1 FROM radix.job_requests) AND NOT EXISTS ("
        " SELECT 1 FROM radix.radix_system_job_state WHERE status IN ('running', 'retry_wait')"
        " OR request_kind IS NOT NULL)").fetchone() == (True,)


def _timestamp(app: App, ns: int) -> str:
    row = app.conn.execute("SELECT to_char(radix.from_ns(%s) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')",
                           (ns,)).fetchone()
    assert row is not None
    return f"TIMESTAMP '{row[0]}+00'"


def test_a_chain_and_a_fan_in_run_once_per_tick_across_a_sigkill(app: App, tmp_path: Path) -> None:
    row = app.conn.execute("SELECT radix.to_ns(date_trunc('second', now()) - interval '1 hour')").fetchone()
    assert row is not None
    origin = int(row[0])
    every = f"EVERY INTERVAL '1 second' STARTING AT {_timestamp(app, origin)}"
    app.job(f"CREATE JOB app.a SCHEDULE {every} RUN AS {{p}} CALL app.record('a')")
    app.job(f"CREATE JOB app.x SCHEDULE {every} RUN AS {{p}} CALL app.record('x') DISABLE")
    app.job("CREATE JOB app.b SCHEDULE AFTER app.a RUN AS {p} CALL app.record('b')")
    app.job("CREATE JOB app.c SCHEDULE AFTER app.b RUN AS {p} CALL app.record('c')")
    app.job("CREATE JOB app.d SCHEDULE AFTER app.a AND app.x RUN AS {p} CALL app.record('d')")

    # one slot, paused after a's first attempt committed: b's tick is queued and cannot start; SIGKILL
    marker = tmp_path / "reached"
    proc = subprocess.Popen([sys.executable, "-m", "tests.acceptance.crash_runner", app.dsn, "upstream",
                             str(marker)])
    wait_for(lambda: marker.exists() or proc.poll() is not None, timeout=60, message="a's commit")
    assert proc.poll() is None, "the runner exited before its pause point"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert sum(_planned(app, "a").values()) == 1
    assert not _planned(app, "b")
    assert app.conn.execute("SELECT count(*) FROM radix.job_requests q JOIN radix.jobs j USING (job_id) "
                            "WHERE j.job_name = 'b' AND q.kind = 'after'").fetchone() == (1,)

    # scheduled ticks on two engines: x joins, a runs at least 5 more ticks
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.x ENABLE")
    with Background(app.dsn, node_id="s1", concurrency=4), Background(app.dsn, node_id="s2", concurrency=4):
        wait_for(lambda: len(_succeeded(app, "app.a") & _succeeded(app, "app.x")) >= 5, timeout=120,
                 message="5 ticks of a and x")
        for job in ("app.a", "app.x"):
            catalog.execute_job_ddl(app.conn, f"ALTER JOB {job} DISABLE")
        wait_for(lambda: _quiet(app), timeout=120, message="the chain to finish")
        # a backfill of 5 more ticks (a disabled job still runs its requests) flows down the chain
        for job in ("app.a", "app.x"):
            catalog.execute_job_ddl(app.conn, f"RUN JOB {job} FOR RANGE {_timestamp(app, origin)} "
                                              f"TO {_timestamp(app, origin + 5 * SECOND)}")
        wait_for(lambda: _quiet(app), timeout=120, message="the backfill to flow down")

    a, x = _succeeded(app, "app.a"), _succeeded(app, "app.x")
    backfilled = {origin + i * SECOND for i in range(5)}
    assert backfilled <= a & x
    assert len(a - backfilled) >= 6  # the tick before the kill, then at least 5
    for tag, ticks in (("a", a), ("b", a), ("c", a), ("x", x), ("d", a & x)):
        effects = _planned(app, tag)
        assert set(effects) == ticks, tag
        assert set(effects.values()) == {1}, f"{tag} ran a tick twice"
