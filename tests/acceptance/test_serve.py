"""The daemon as users run it: several nodes, kills, PostgreSQL restarts, shutdown, status, discovery."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from radixjobs import migrate
from radixjobs.embedded import EmbeddedServer
from radixjobs.latency import LATENCY_BUCKETS_S
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.support import PgCluster, wait_for


def _jobs(app: App, count: int, every: str = "1 second", procedure: str = "app.record") -> None:
    app.conn.execute(
        "SELECT radix.create_job('app.j' || g, jsonb_build_object('every', %s::text), %s, %s, "
        "jsonb_build_array(jsonb_build_object('kind', 'string', 'value', 'j' || g))) "
        "FROM generate_series(1, %s) g", (every, app.principal, procedure, count))


def _dsn_env(app: App) -> dict[str, str]:
    return {"RADIXJOBS_DSN": app.dsn}


def _check_ticks(app: App) -> None:
    """Every due tick ran exactly once or was coalesced; attempts of one job never overlapped."""
    duplicates = app.conn.execute("SELECT key FROM app.effects GROUP BY key HAVING count(*) > 1").fetchall()
    assert duplicates == []
    # ticks of an interval job lie on anchor + k*interval (k >= 1; k >= 0 from a STARTING AT ahead, as these
    # jobs have); each one up to the last that ran either ran once or was coalesced (counted)
    rows = app.conn.execute("""
        SELECT s.job_id, s.anchor_ns, j.interval_ns, j.starting_at_ns IS NOT NULL, s.coalesced_ticks,
               (SELECT count(*) FROM app.effects e WHERE e.job = s.job_id) AS runs,
               (SELECT max(h.planned_ns) FROM radix.radix_system_job_history h
                WHERE h.job_id = s.job_id AND h.status = 'succeeded') AS last_ns
        FROM radix.radix_system_job_state s JOIN radix.jobs j USING (job_id)
        WHERE j.schedule_kind = 'every'""").fetchall()
    for job, anchor_ns, interval_ns, from_start, coalesced, runs, last_ns in rows:
        if last_ns is None:
            continue
        history = app.conn.execute("SELECT planned_ns, attempt, status, node, error FROM "
                                   "radix.radix_system_job_history WHERE job_id = %s ORDER BY planned_ns",
                                   (job,)).fetchall()
        assert runs + coalesced == (last_ns - anchor_ns) // interval_ns + from_start, "\n".join(map(str, history))
    overlaps = app.conn.execute("""
        SELECT count(*) FROM (
            SELECT started_at, lag(finished_at) OVER (PARTITION BY job_id ORDER BY started_at) AS prev_end
            FROM radix.radix_system_job_history) h
        WHERE started_at < prev_end""").fetchone()
    assert overlaps == (0,)


@pytest.mark.versions
def test_ticks_of_one_second_jobs_run_once_each_and_never_early(app: App, tmp_path: Path) -> None:
    """What "on time" means that no load can break: 50 jobs EVERY 1 second, their ticks spread over the
    second, under one node. A tick found ahead waits for its time: radix.start_tick refuses one that arrives
    early (RXT01), and with one node nothing else makes it refuse one, so the node counts no refused tick;
    each due tick runs once or is counted as coalesced. How late ticks start is measured on every
    PostgreSQL version by bench/run.py lateness (docs/benchmarks.md), never asserted here."""
    app.conn.execute(
        "SELECT radix.create_job('app.s' || g, jsonb_build_object('every', '1 second', 'starting_at_ns', "
        "(radix.to_ns(clock_timestamp()) / 1000000000 + 2) * 1000000000 + g * 20000000), %s, 'app.record', "
        "jsonb_build_array(jsonb_build_object('kind', 'string', 'value', 's' || g))) FROM generate_series(0, 49) g",
        (app.principal,))
    daemon = Serve(tmp_path, env=_dsn_env(app), name="node")
    try:
        wait_for(lambda: app.conn.execute("SELECT count(*) >= 250 FROM app.effects").fetchone() == (True,),
                 timeout=120, interval=0.5, message="250 ticks")
        counters = daemon.status()["counters"]
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
    finally:
        daemon.stop()
    assert counters["ticks_refused"] == 0, counters
    _check_ticks(app)
    assert app.conn.execute("SELECT count(*) FROM app.effects WHERE at < scheduled").fetchone() == (0,)


@pytest.mark.versions
@pytest.mark.parametrize("nodes", [2, 3])
def test_nodes_share_the_work_without_duplicates(app: App, tmp_path: Path, nodes: int) -> None:
    _jobs(app, 100)
    daemons = [Serve(tmp_path, env=_dsn_env(app), name=f"node{i}") for i in range(nodes)]
    try:
        wait_for(lambda: app.conn.execute(
            "SELECT count(*) >= 1000 AND (SELECT count(DISTINCT node) FROM radix.radix_system_job_history) = %s "
            "FROM app.effects", (nodes,)).fetchone() == (True,),
            timeout=180, interval=0.5, message="1000 attempts, by every node")
        for daemon in daemons:
            daemon.signal(signal.SIGTERM)
        assert [daemon.wait() for daemon in daemons] == [0] * nodes
    finally:
        for daemon in daemons:
            daemon.stop()
    _check_ticks(app)
    workers = app.conn.execute("SELECT count(DISTINCT node) FROM radix.radix_system_job_history").fetchone()
    assert workers == (nodes,)
    live = app.conn.execute("SELECT count(*) FROM radix.radix_system_job_state WHERE lease_token IS NOT NULL")
    assert live.fetchone() == (0,)  # every lease released on shutdown


@pytest.mark.versions
def test_killed_node_is_replaced_within_seconds(app: App, tmp_path: Path) -> None:
    app.conn.execute("CREATE PROCEDURE app.slow(tag text) LANGUAGE plpgsql AS $$ BEGIN "
                     "CALL app.record(tag); PERFORM pg_sleep(2); END $$")
    doomed = Serve(tmp_path, env=_dsn_env(app), name="doomed")
    survivor = None
    try:
        _jobs(app, 4, "1 hour", "app.slow")
        app.conn.execute("UPDATE radix.radix_system_job_state SET due_ns = radix.to_ns(clock_timestamp())")
        wait_for(lambda: app.conn.execute(
            "SELECT count(*) FROM radix.radix_system_job_state WHERE lease_node = 'doomed'").fetchone() == (4,),
            message="the doomed node to hold the claims")
        keys = {r[0] for r in app.conn.execute("SELECT idempotency_key FROM radix.radix_system_job_state")}
        doomed.signal(signal.SIGKILL)
        doomed.wait()
        survivor = Serve(tmp_path, env=_dsn_env(app), name="survivor")
        # within 120 s, however loaded the machine: far sooner than the 5-minute lease
        wait_for(lambda: app.conn.execute(
            "SELECT count(*) FROM radix.radix_system_job_history WHERE node = 'survivor' AND status = 'succeeded'"
        ).fetchone() == (4,), timeout=120, message="the survivor to finish the ticks")
        resumed = {r[0] for r in app.conn.execute(
            "SELECT idempotency_key FROM radix.radix_system_job_history WHERE node = 'survivor'")}
        assert resumed == keys
        lost = app.conn.execute("SELECT count(*) FROM radix.radix_system_job_history WHERE status = 'lease_lost'")
        assert lost.fetchone() == (4,)
        assert survivor.status()["counters"]["lease_recoveries"] == 4
        survivor.signal(signal.SIGTERM)
        assert survivor.wait() == 0
    finally:
        doomed.stop()
        if survivor:
            survivor.stop()
    assert len(app.effects()) == 4  # the killed attempts' effects rolled back: each tick's effect once


@pytest.mark.versions
def test_postgres_restart_under_a_running_daemon(app: App, pg: PgCluster, tmp_path: Path) -> None:
    if pg.server is None:
        pytest.skip("needs the embedded server to restart it")
    _jobs(app, 5)
    daemon = Serve(tmp_path, env=_dsn_env(app), name="node")
    try:
        wait_for(lambda: len(app.effects()) >= 10, timeout=60, message="attempts before the restart")
        app.conn.close()
        pg.server.restart()
        app.conn = psycopg.connect(app.dsn, autocommit=True)
        before = len(app.effects())
        wait_for(lambda: len(app.effects()) >= before + 10, timeout=60, interval=0.2,
                 message="attempts after the restart")
        assert daemon.status()["databases"][0]["reconnects"] >= 1
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
        _check_ticks(app)
    finally:
        daemon.stop()
        app.conn.close()


def test_sigterm_waits_then_cancels_past_the_grace(app: App, tmp_path: Path) -> None:
    app.conn.execute("CREATE PROCEDURE app.long() LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(600); END $$")
    app.job("CREATE JOB app.long SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.long()")
    daemon = Serve(tmp_path, "--grace", "1", env=_dsn_env(app), name="node")
    try:
        wait_for(lambda: app.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%CALL%%long%%' "
                                          "AND state = 'active' AND wait_event = 'PgSleep'").fetchone() == (1,),
                 message="the long CALL")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(120) == 0  # cancelled after the 1 s grace, long before its 600 s sleep ends
    finally:
        daemon.stop()
    (h,) = app.history("app.long")
    assert h["status"] == "retrying"
    assert h["error"]["category"] == "cancellation"
    state = app.state("app.long")
    assert state["status"] == "retry_wait"
    assert state["lease_node"] is None  # released: another node may take it over at once


def test_status_metrics_healthz_stay_bounded(app: App, tmp_path: Path) -> None:
    app.conn.execute("CREATE PROCEDURE app.fail(tag text) LANGUAGE plpgsql AS $$ BEGIN "
                     "RAISE EXCEPTION 'failure % with a secret table name', tag; END $$")
    _jobs(app, 30, "1 second", "app.fail")
    daemon = Serve(tmp_path, env=_dsn_env(app), name="node")
    try:
        wait_for(lambda: daemon.status()["counters"]["failures_raised_exception"] >= 60, timeout=60,
                 message="failures")
        status = daemon.status()
        assert set(status) == {"node", "uptime_s", "version", "databases", "counters", "running_attempts",
                               "last_error", "clusters"}
        assert status["node"] == "node"
        assert status["last_error"] == {"source": "job", "category": "raised_exception", "kind": "raise_exception"}
        code, metrics = daemon.get("/metrics")
        assert code == 200
        series = [line for line in metrics.splitlines() if line and not line.startswith("#")]
        # fixed, whatever the number of jobs and errors: 31 counters and gauges (4 of them the failure events'),
        # 7 per --dsn target, and four histograms (claims, attempts by outcome) of len(LATENCY_BUCKETS_S) + 1
        # buckets, a sum and a count each
        assert len(series) == 31 + 7 + 4 * (len(LATENCY_BUCKETS_S) + 3)
        assert "secret table" not in metrics
        assert 'radixjobs_failures_total{category="raised_exception"}' in metrics
        assert daemon.get("/healthz") == (200, "ok")
        lines = [line for line in daemon.log_lines() if line["message"].startswith("attempt finish")]
        assert {"job", "tick", "attempt", "node", "duration_ms", "outcome"} <= set(lines[0])
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait()
        daemon.stop()


def test_new_ready_database_is_picked_up(tmp_path: Path) -> None:
    """On a cluster of its own: a daemon serving every database would serve other tests' databases too."""
    server = EmbeddedServer(tmp_path / "own", settings={"fsync": "off", "synchronous_commit": "off"})
    info, _ = server.ensure_running(persistent=True)
    try:
        with psycopg.connect(info.dsn(), autocommit=True) as conn:
            migrate.install(conn)
        daemon = Serve(tmp_path, "--all-databases", "--discovery-interval", "0.5",
                       env={"RADIXJOBS_DSN": info.dsn()}, name="node")
        name = f"late_{uuid.uuid4().hex[:8]}"
        try:
            with psycopg.connect(info.dsn(), autocommit=True) as admin:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            with psycopg.connect(make_conninfo(info.dsn(), dbname=name), autocommit=True) as conn:
                migrate.install(conn)
            wait_for(lambda: name in {d["name"] for d in daemon.status()["databases"]}, timeout=60,
                     message="the new database to be served")
            daemon.signal(signal.SIGTERM)
            assert daemon.wait() == 0
        finally:
            daemon.stop()
    finally:
        server.release()
        server.destroy()


def test_demo_on_the_embedded_server(tmp_path: Path) -> None:
    """README's first command: serve --demo with no DSN runs a job on the embedded PostgreSQL."""
    home = tmp_path / "home"
    daemon = Serve(tmp_path, "--demo", "--home", str(home), name="demo")
    try:
        wait_for(lambda: daemon.status()["counters"]["successes"] >= 1, timeout=60, message="a demo run")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
    finally:
        daemon.stop()
    from tests.acceptance.conftest import run_cli

    assert run_cli("db", "status", "--home", str(home)).returncode == 3  # the server it started is stopped
    EmbeddedServer(home).destroy()  # as root the cluster may live outside the home (/var/lib/radixjobs)


def test_daemon_runs_cron_table_documents_beside_jobs(app: App, tmp_path: Path) -> None:
    from radixjobs import catalog, documents

    app.conn.execute("CREATE PROCEDURE app.archive_logs() LANGUAGE plpgsql AS $$ BEGIN "
                     "CALL app.record('archived'); END $$")
    app.job("CREATE JOB app.tick SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('tick')")
    with psycopg.connect(app.dsn, user=app.principal, autocommit=True) as as_principal:
        documents.apply(as_principal, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
            "NUM": 101, "DB_FUNCTION": "app.archive_logs", "INTERVAL": "NOW() + INTERVAL '1 hour'"}})
    daemon = Serve(tmp_path, env=_dsn_env(app), name="node")
    try:
        wait_for(lambda: daemon.status()["counters"]["doc_successes"] >= 1
                 and daemon.status()["counters"]["successes"] >= 1, timeout=60, message="a job and a document run")
        assert "radixjobs_doc_successes_total 1.0" in daemon.get("/metrics")[1]
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
    finally:
        daemon.stop()
    assert "archived" in [e[1] for e in app.effects()]
    names = {row["name"] for row in catalog.list_jobs(app.conn) + documents.overview(app.conn)}
    assert names == {"app.tick", "doc:101"}
