"""Several targets per daemon: labels without secrets, refused duplicates, nested slots, node ids, health."""

from __future__ import annotations

import pytest

from radixjobs.engine.slots import Slots
from radixjobs.errors import ConfigError
from radixjobs.server import Daemon, DaemonConfig
from radixjobs.server.clusters import ClusterSlots, check_targets, target_label


def test_a_label_is_host_port_and_database_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(name, raising=False)
    assert target_label("host=db1 port=5433 dbname=app user=u password=s3cret sslmode=require") == "db1:5433/app"
    assert target_label("postgresql://u:s3cret@db2/app?connect_timeout=3") == "db2:5432/app"
    assert target_label("host=a,b port=5432,5433 dbname=app target_session_attrs=read-write") == "a:5432,b:5433/app"
    assert target_label("host=a,b dbname=app") == "a:5432,b:5432/app"
    assert target_label("user=bob password=x") == "localhost:5432/bob"  # libpq's default database: the user
    monkeypatch.setenv("PGHOST", "/run/postgresql")
    monkeypatch.setenv("PGDATABASE", "envdb")
    assert target_label("") == "/run/postgresql:5432/envdb"


def test_the_same_target_twice_is_refused() -> None:
    assert check_targets(["host=a dbname=x", "host=a dbname=y", "host=b dbname=x"]) == ["a:5432/x", "a:5432/y",
                                                                                       "b:5432/x"]
    with pytest.raises(ConfigError, match=r"^--dsn: a:5432/x is given twice"):
        check_targets(["host=a dbname=x password=p", "postgresql://u@a:5432/x"])


def test_cluster_slots_take_from_the_node_too() -> None:
    node = Slots(5)
    one, two = ClusterSlots(3, node), ClusterSlots(3, node)
    assert one.reserve(10) == 3
    assert (one.free, two.free, node.free) == (0, 2, 2)
    assert two.reserve(3) == 2  # the node's capacity bounds the sum
    assert (two.free, node.free) == (0, 0)
    one.release(2)
    assert (one.free, two.free, node.free) == (2, 1, 2)
    one.release(5)  # never more than it holds
    assert (one.in_use, node.in_use) == (0, 2)


def test_shares_node_ids_and_health_of_several_targets() -> None:
    daemon = Daemon(DaemonConfig(dsn="host=/nonexistent dbname=a", extra_dsns=["host=/elsewhere dbname=b"],
                                 node_id="n", concurrency=9))
    first, second = daemon.clusters
    assert (first.label, second.label) == ("/nonexistent:5432/a", "/elsewhere:5432/b")
    assert (first.node_id, second.node_id) == ("n@/nonexistent:5432/a", "n@/elsewhere:5432/b")
    assert (first.slots.capacity, second.slots.capacity) == (4, 4)
    assert daemon.is_healthy() == (False, "not ready: no cluster is served: /nonexistent:5432/a (PostgreSQL is "
                                          "not reachable); /elsewhere:5432/b (PostgreSQL is not reachable)")
    first.reachable = True
    daemon.config.all_databases = True
    assert daemon.is_healthy() == (True, "degraded: 1 of 2 clusters not ready: /elsewhere:5432/b (PostgreSQL is "
                                         "not reachable)")
    second.reachable = True
    assert daemon.is_healthy() == (True, "ok")
    assert [c["target"] for c in daemon.status()["clusters"]] == ["/nonexistent:5432/a", "/elsewhere:5432/b"]


def test_one_target_keeps_the_node_id_and_every_slot() -> None:
    daemon = Daemon(DaemonConfig(dsn="host=/nonexistent dbname=a", node_id="n", concurrency=9))
    [only] = daemon.clusters
    assert (only.node_id, only.slots.capacity) == ("n", 9)
    custom = Daemon(DaemonConfig(dsn="host=/x dbname=a", extra_dsns=["host=/y dbname=a"], node_id="n",
                                 concurrency=9, per_cluster_concurrency=7))
    assert [c.slots.capacity for c in custom.clusters] == [7, 7]
