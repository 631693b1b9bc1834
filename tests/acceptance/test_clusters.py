"""One daemon, several clusters (``serve --dsn A --dsn B …``): the embedded server and the distribution's
PostgreSQL at once, beside a target that is down (nothing listens on a free loopback port) and one that hangs
(a loopback listener that never answers). The live clusters' jobs run while the others are retried; status,
metrics and health show each cluster by host:port/db, never a password; node ids are per target."""

from __future__ import annotations

import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.acceptance.conftest import run_cli
from tests.acceptance.serving import Serve
from tests.acceptance.test_external_cluster import effects, job
from tests.apps import App, make_app
from tests.external import ExternalDb
from tests.support import wait_for


@pytest.fixture
def hung_port() -> Iterator[int]:
    """A loopback port whose listener accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_one_daemon_serves_two_clusters_beside_a_down_and_a_hung_one(app: App, db: str, ext: ExternalDb,
                                                                      hung_port: int, tmp_path: Path) -> None:
    app.job("CREATE JOB app.tick SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('tick')")
    job(ext, ext.role("ext_multi"), name="tick", schedule="EVERY INTERVAL '1 second'")
    down = f"host=127.0.0.1 port={_free_port()} dbname=gone user=nobody"
    hung = f"host=127.0.0.1 port={hung_port} dbname=hung user=nobody"
    server = Serve(tmp_path, "--dsn", db, "--dsn", ext.dsn(), "--dsn", down, "--dsn", hung, "--poll", "0.2",
                   "--concurrency", "8", env=ext.env())
    embedded_label = wait_for(lambda: server.status()["clusters"][0]["target"], message="the first cluster")
    ext_label = f"127.0.0.1:{ext.cluster.port}/{ext.name}"
    labels = [embedded_label, ext_label, f"127.0.0.1:{down.split()[1][5:]}/gone", f"127.0.0.1:{hung_port}/hung"]
    try:
        def ticks() -> tuple[int, int]:
            return len(app.effects()), len([e for e in effects(ext) if e[0] == "tick"])

        wait_for(lambda: min(ticks()) >= 3, timeout=60, message="three ticks on each live cluster")
        # the hung target's look ends after its timeout; meanwhile and after, the live clusters keep running
        clusters = wait_for(lambda: (c := server.status()["clusters"])[3]["reachable"] is False and c,
                            timeout=60, message="the hung target to be found unreachable")
        assert [(c["target"], c["reachable"], c["slots"]) for c in clusters] == [
            (labels[0], True, 2), (labels[1], True, 2), (labels[2], False, 2), (labels[3], False, 2)]
        assert [c["node"] for c in clusters] == [f"node@{label}" for label in labels]
        before = ticks()
        wait_for(lambda: all(now >= then + 2 for now, then in zip(ticks(), before, strict=True)), timeout=60,
                 message="two more ticks on each live cluster")
        status = server.status()
        assert {(d["cluster"], d["name"], d["connected"]) for d in status["databases"]} == {
            (labels[0], db.split("dbname=")[1].split()[0], True), (labels[1], ext.name, True)}
        code, health = server.get("/healthz")
        assert code == 200
        assert health == f"degraded: 2 of 4 clusters not ready: {labels[2]} (PostgreSQL is not reachable); " \
                         f"{labels[3]} (PostgreSQL is not reachable)"
        metrics = server.get("/metrics")[1]
        for label, up in zip(labels, (1, 1, 0, 0), strict=True):
            assert f'radixjobs_cluster_reachable{{cluster="{label}"}} {up}.0' in metrics
        assert f'radixjobs_cluster_successes_total{{cluster="{ext_label}"}}' in metrics
        with psycopg.connect(ext.dsn(), autocommit=True) as conn:
            nodes = [row[0] for row in conn.execute("SELECT node_id FROM radix.nodes ORDER BY 1")]
        assert f"node@{ext_label}" in nodes
        assert "node" not in nodes
        shown = run_cli("status", "--http", server.url)
        assert shown.returncode == 0, shown.stderr
        assert "clusters:" in shown.stdout
        assert all(label in shown.stdout for label in labels)
        server.signal(signal.SIGTERM)
        assert server.wait(60) == 0  # the hung target's look does not hold the stop up
        text = server.log.read_text() + str(status) + metrics + health + shown.stdout
        for password in ext.cluster.passwords.values():
            assert password not in text
        assert any(line.get("event") == "postgres_unreachable" and line.get("cluster") == labels[2]
                   for line in server.log_lines())
    finally:
        server.stop()


@pytest.fixture
def other_app(pg: Any, template_db: str, roles: Any) -> Iterator[App]:
    """A second database of the embedded server, set up as ``app`` is (another target of the daemon)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                       sql.Identifier(template_db)))
    try:
        with psycopg.connect(pg.dsn_for(name), autocommit=True) as conn:
            yield make_app(pg.dsn_for(name), conn, roles("hogger"))
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_cluster_whose_attempts_hang_keeps_to_its_share_of_the_slots(app: App, other_app: App,
                                                                      tmp_path: Path) -> None:
    """Attempts that never end in one target hold its share (--concurrency split evenly), not the node's
    slots: the other target's job keeps running."""
    other_app.conn.execute("CREATE PROCEDURE app.hang() LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(600); END $$")
    for index in range(4):
        other_app.job(f"CREATE JOB app.hang{index} SCHEDULE EVERY INTERVAL '1 second' RUN AS {{p}} CALL app.hang()")
    app.job("CREATE JOB app.tick SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('tick')")
    server = Serve(tmp_path, "--dsn", app.dsn, "--dsn", other_app.dsn, "--concurrency", "4",
                   "--max-per-principal", "0", "--poll", "0.2")
    try:
        def hanging() -> int:
            return int(server.status()["clusters"][1]["running_attempts"])

        wait_for(lambda: hanging() == 2, timeout=60, message="the hanging target to fill its 2 slots")
        before = len(app.effects())
        wait_for(lambda: len(app.effects()) >= before + 3, timeout=60, message="three more ticks elsewhere")
        assert hanging() == 2  # never more than its share
        assert [c["slots"] for c in server.status()["clusters"]] == [2, 2]
    finally:
        server.stop()
