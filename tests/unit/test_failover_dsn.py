"""Multi-host DSNs survive every rewrite radixjobs makes of a DSN; owners reconnect when a primary is found
again (docs/failover.md; the real switchover is tests/acceptance/test_failover.py)."""

from __future__ import annotations

from typing import Any

from psycopg.conninfo import conninfo_to_dict

from radixjobs.db import scheduler_dsn
from radixjobs.engine.principals import principal_dsn
from radixjobs.engine.slots import Slots
from radixjobs.server import Daemon, DaemonConfig
from radixjobs.server.clusters import dsn_for_database
from radixjobs.server.owner import DatabaseOwner

MULTI = "host=127.0.0.1,127.0.0.1 port=5432,5433 dbname=app user=sched target_session_attrs=read-write"


def _members(dsn: str) -> tuple[Any, Any, Any]:
    params = conninfo_to_dict(dsn)
    return params["host"], params["port"], params["target_session_attrs"]


def test_every_derived_dsn_keeps_all_members_and_the_session_attrs() -> None:
    expected = ("127.0.0.1,127.0.0.1", "5432,5433", "read-write")
    for dsn in (scheduler_dsn(MULTI), dsn_for_database(scheduler_dsn(MULTI), "other"),
                principal_dsn(scheduler_dsn(MULTI), "worker")):
        assert _members(dsn) == expected
    assert conninfo_to_dict(dsn_for_database(MULTI, "other"))["dbname"] == "other"


def test_owners_are_woken_when_postgresql_is_reachable_again() -> None:
    daemon = Daemon(DaemonConfig(dsn=MULTI, node_id="n"))
    (cluster,) = daemon.clusters  # the target's supervisor (server/clusters.py) watches reachability
    owner = DatabaseOwner("app", daemon.config.dsn, node_id="n", slots=Slots(1), concurrency=1)
    cluster.owners["app"] = (owner, None)  # type: ignore[assignment]
    cluster._reachability(True)
    assert not owner.reachable.is_set()  # the first look is no recovery
    cluster._reachability(False, "session is read-only")
    assert not owner.reachable.is_set()
    cluster._reachability(True)
    assert owner.reachable.is_set()  # a failover's new primary found: reconnect now
