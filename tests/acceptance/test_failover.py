"""Primary failover (docs/failover.md): two daemons on a libpq multi-host DSN follow a switchover.

A real pair of the distribution's PostgreSQL (tests/replica.py): a primary and a synchronous streaming
standby. An atomic job (its effect keyed by the idempotency key, unique) and a non-atomic one (it commits
inside) tick every second under two ``radixjobs serve`` processes; a third one, holding a claim, is killed
with the primary. The primary is stopped ``immediate`` (no shutdown checkpoint, no goodbye to the clients)
and, once the daemons have been retrying a while, the standby promoted. Then: scheduling resumes on the new
primary, the dead node's claim is taken over long before its lease ends, no atomic effect is duplicated,
everything the old primary had committed is there, and the daemons never exited. The resume delays are
printed (``pytest -s``), never asserted.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from radixjobs.engine.leases import DEFAULT_LEASE_S
from tests.acceptance.conftest import run_cli
from tests.acceptance.serving import Serve
from tests.apps import App, make_app
from tests.external import SCHEDULER, distribution_bin, new_database
from tests.replica import Pair, replicated_pair
from tests.support import wait_for

APP_SQL = """
CREATE TABLE app.ticks (key text PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE app.steps (id bigserial PRIMARY KEY, key text NOT NULL, step int NOT NULL,
                        at timestamptz NOT NULL DEFAULT clock_timestamp());
GRANT INSERT, SELECT ON app.ticks, app.steps TO {p};
GRANT USAGE ON SEQUENCE app.steps_id_seq TO {p};
CREATE PROCEDURE app.atomic_tick() LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO app.ticks (key) VALUES (radix.current_idempotency_key());
  PERFORM pg_sleep(0.2);  -- often in flight when the primary goes
END $$;
CREATE PROCEDURE app.hold_tick() LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO app.ticks (key) VALUES (radix.current_idempotency_key());
  IF pg_catalog.inet_server_port() = {old_port} THEN  -- hangs on the old primary, ends on the new one
    PERFORM pg_sleep(600);
  END IF;
END $$;
CREATE PROCEDURE app.step_tick() LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO app.steps (key, step) VALUES (radix.current_idempotency_key(), 1);
  COMMIT;
  PERFORM pg_sleep(0.2);
  INSERT INTO app.steps (key, step) VALUES (radix.current_idempotency_key(), 2);
  COMMIT;
END $$;
"""


@pytest.fixture
def pair() -> Iterator[Pair]:
    if distribution_bin() is None:
        if os.environ.get("RADIXJOBS_REQUIRE_EXTERNAL_PG") or os.environ.get("CI"):
            pytest.fail("no distribution PostgreSQL (/usr/lib/postgresql/*/bin/initdb): .ci/run installs it")
        pytest.skip("no distribution PostgreSQL installed: apt-get install postgresql")
    yield from replicated_pair()


def _snapshot(conn: psycopg.Connection[Any]) -> dict[str, set[Any]]:
    """What the old primary shows as committed: atomic effects, non-atomic steps, finished attempts."""
    return {
        "ticks": {r[0] for r in conn.execute("SELECT key FROM app.ticks")},
        "steps": {tuple(r) for r in conn.execute("SELECT id, key, step FROM app.steps")},
        "history": {tuple(r) for r in conn.execute(
            "SELECT history_id, idempotency_key, attempt, status FROM radix.radix_system_job_history "
            "WHERE finished_at IS NOT NULL")},
    }


def _healthz(daemon: Serve) -> int:
    try:
        return daemon.get("/healthz")[0]
    except urllib.error.HTTPError as exc:
        return exc.code


def _counts(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    row = conn.execute("SELECT (SELECT count(*) FROM app.ticks), "
                       "(SELECT count(DISTINCT key) FROM app.steps WHERE step = 2)").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.slow
def test_two_daemons_follow_a_primary_failover(pair: Pair, tmp_path: Path) -> None:
    db = new_database(pair.primary)
    dsn = pair.multi_host_dsn(SCHEDULER, db.name)
    passfile = tmp_path / "pgpass"
    passfile.touch(mode=0o600)
    env = {"PGPASSWORD": pair.primary.passwords[SCHEDULER], "PGPASSFILE": str(passfile)}
    installed = run_cli("install", "--dsn", dsn, env=env)
    assert installed.returncode == 0, installed.stderr
    principal = db.role("failover", in_passfile=False)
    with passfile.open("a", encoding="utf-8") as fh:  # either member may be the primary: any port
        fh.write(f"127.0.0.1:*:*:{principal}:{pair.primary.passwords[principal]}\n")
    with db.admin() as conn:
        make_app(db.dsn(), conn, principal)
        conn.execute(sql.SQL(APP_SQL.replace("{p}", "{}").replace("{old_port}", str(pair.primary.port))).format(
            *[sql.Identifier(principal)] * APP_SQL.count("{p}")))  # type: ignore[arg-type]

    # a node that goes down with the primary, holding a claim (the attempt hangs on the old primary only)
    lost = Serve(tmp_path, "--dsn", dsn, "--poll", "0.5", env=env, name="lost")
    daemons: list[Serve] = []
    try:
        with db.admin() as conn:
            App(db.dsn(), conn, principal).job(
                "CREATE JOB app.hold SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.hold_tick()")
            wait_for(lambda: conn.execute(
                "SELECT count(*) FROM radix.radix_system_job_state WHERE lease_node = 'lost'").fetchone() == (1,)
                and conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%hold_tick%%' "
                                 "AND state = 'active' AND backend_type = 'client backend' "
                                 "AND pid <> pg_backend_pid()").fetchone() == (1,),
                timeout=60, message="the lost node to run app.hold")
            app = App(db.dsn(), conn, principal)
            app.job("CREATE JOB app.atomic SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.atomic_tick()")
            app.job("CREATE JOB app.steps SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.step_tick()")
        daemons += [Serve(tmp_path, "--dsn", dsn, "--poll", "0.5", "--discovery-interval", "1", env=env,
                          name=f"node{i}") for i in range(2)]
        old = pair.primary.admin(db.name)
        wait_for(lambda: min(_counts(old)) >= 3, timeout=60, message="ticks of both jobs on the old primary")
        before = _snapshot(old)  # committed, hence (synchronous replication) on the standby's disk
        lost.signal(signal.SIGKILL)
        pair.primary.ctl("-m", "immediate", "stop")
        old.close()
        stopped = time.monotonic()
        # as under Patroni, the standby is promoted only a while later: meanwhile the daemons find no
        # primary (the standby refuses read-write sessions) and keep retrying, their backoff growing
        for daemon in daemons:
            wait_for(lambda d=daemon: _healthz(d) != 200 and d.status()["databases"][0]["reconnects"] >= 6,
                     timeout=60, interval=0.1, message="the daemons to look for a primary")
        pair.standby.ctl("promote")
        promoted = time.monotonic()
        new = pair.standby.admin(db.name)
        at_promotion = _counts(new)
        resumed = wait_for(lambda: all(n > b for n, b in zip(_counts(new), at_promotion, strict=True))
                           and time.monotonic(), timeout=60, interval=0.1,
                           message="both jobs to tick on the new primary")
        recovered = wait_for(lambda: new.execute(
            "SELECT count(*) FROM radix.job_history WHERE name = 'app.hold' AND status = 'succeeded'"
        ).fetchone() == (1,) and time.monotonic(), timeout=60, interval=0.1,
            message="the lost node's claim to be taken over")
        print(f"\nfailover: primary stopped, standby promoted {promoted - stopped:.2f}s later; both jobs ticked "
              f"again {resumed - promoted:.2f}s after the promotion; the lost node's claim (lease "
              f"{DEFAULT_LEASE_S}s) ran again {recovered - promoted:.2f}s after it")
        more = _counts(new)
        wait_for(lambda: all(n >= m + 2 for n, m in zip(_counts(new), more, strict=True)), timeout=60,
                 message="scheduling to go on")
        after = _snapshot(new)
        assert before["ticks"] <= after["ticks"], "an atomic tick committed on the old primary was lost"
        assert before["steps"] <= after["steps"], "a step committed on the old primary was lost"
        assert before["history"] <= after["history"], "an attempt finished on the old primary was lost"
        # no atomic effect twice: the unique key never refused one, and each tick succeeded at most once
        refused = new.execute("SELECT count(*) FROM radix.radix_system_job_history "
                              "WHERE error->>'sqlstate' = '23505'").fetchone()
        assert refused == (0,)
        twice = new.execute("SELECT idempotency_key FROM radix.radix_system_job_history WHERE status = 'succeeded' "
                            "GROUP BY idempotency_key HAVING count(*) > 1").fetchall()
        assert twice == []
        # each atomic effect belongs to exactly one succeeded attempt, and vice versa (one snapshot)
        unmatched = new.execute("""
            SELECT count(*) FROM (SELECT h.idempotency_key FROM radix.radix_system_job_history h
                                  JOIN radix.job_overview j USING (job_id)
                                  WHERE j.name IN ('app.atomic', 'app.hold') AND h.status = 'succeeded') s
            FULL JOIN app.ticks t ON t.key = s.idempotency_key
            WHERE t.key IS NULL OR s.idempotency_key IS NULL""").fetchone()
        assert unmatched == (0,)
        takers = new.execute("SELECT node FROM radix.job_history WHERE name = 'app.hold' AND status = 'succeeded'")
        assert takers.fetchone() in {("node0",), ("node1",)}
        new.close()
        for daemon in daemons:
            assert daemon.proc.poll() is None, daemon.log.read_text()[-2000:]
            wait_for(lambda d=daemon: _healthz(d) == 200, timeout=60, message="healthz after failover")
            assert daemon.status()["databases"][0]["reconnects"] >= 1
        for daemon in daemons:
            daemon.signal(signal.SIGTERM)
        assert [daemon.wait() for daemon in daemons] == [0, 0]
    finally:
        for daemon in [lost, *daemons]:
            daemon.stop()
