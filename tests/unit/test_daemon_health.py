"""/healthz readiness of a daemon: PostgreSQL reachable, its one database served, not stopping."""

from __future__ import annotations

import pytest

from radixjobs.server import Daemon, DaemonConfig


def test_readiness_states() -> None:
    daemon = Daemon(DaemonConfig(dsn="host=/nonexistent dbname=app", node_id="n"))
    assert daemon.is_healthy() == (False, "not ready: PostgreSQL is not reachable")  # before the first look
    daemon.reachable = True
    assert daemon.is_healthy() == (False, "not ready: the database is not ready (radixjobs install)")
    daemon.config.all_databases = True  # a reachable cluster is ready even while none of its databases is
    assert daemon.is_healthy() == (True, "ok")
    daemon.reachable = False
    assert daemon.is_healthy() == (False, "not ready: PostgreSQL is not reachable")
    daemon.stop()
    assert daemon.is_healthy() == (False, "stopping")


def test_one_log_line_per_change_of_state(caplog: pytest.LogCaptureFixture) -> None:
    daemon = Daemon(DaemonConfig(dsn="host=/nonexistent dbname=app", node_id="n"))
    caplog.set_level("INFO", logger="radixjobs.server")
    for reachable in (False, False, False, True, True, False, True):
        daemon.clusters[0]._reachability(reachable, "refused")
    messages = [r.getMessage().split(" node=")[0] for r in caplog.records]
    assert messages == ["PostgreSQL is not reachable", "PostgreSQL is reachable again",
                        "PostgreSQL is not reachable", "PostgreSQL is reachable again"]
