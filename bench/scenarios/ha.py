"""HA on Patroni: two radixjobs serve on a multi-host DSN through a switchover, a kill -9 and a SIGSTOP.

Its own servers (bench/ha_stack.py): etcd and three Patroni members of PostgreSQL 15 on 127.0.0.1,
``synchronous_mode`` on. Jobs: three atomic ones every second, two non-atomic ones every second (three
commits each, the middle one guarded by ``radix.once()``), and a chain a → b → c of atomic jobs of
``--chain-seconds`` each. Events, in order (``--events``): ``switchover`` (``patronictl switchover`` to the
synchronous standby), ``kill`` (SIGKILL of the leader's postmaster), ``stall`` (SIGSTOP of the leader's
Patroni and PostgreSQL, continued ``--stall-hold`` seconds after another member accepts writes). Measured per
event: seconds until a member other than the old leader accepts writes (Patroni's part), seconds from then to
the first attempt committed on it (radixjobs' part), atomic effects twice, committed effects lost (what the
old leader showed committed just before the event, missing at the end), and what the non-atomic jobs saw.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from typing import Any

import psycopg
from psycopg import sql

import ha_check as check
from ha_stack import SUPERUSER, PatroniCluster, Timing, patroni_cluster, tools_missing
from harness import Daemon, wait_for
from radixjobs import catalog, migrate

DATABASE = "radix_ha"
PRINCIPAL = "ha_worker"
APP_SQL = """
CREATE SCHEMA ha;
CREATE TABLE ha.effects (id bigserial PRIMARY KEY, key text NOT NULL, job text NOT NULL, step int NOT NULL DEFAULT 0,
                         at timestamptz NOT NULL DEFAULT clock_timestamp(), port int DEFAULT inet_server_port());
GRANT USAGE ON SCHEMA ha TO {p};
GRANT INSERT ON ha.effects TO {p};
GRANT USAGE ON SEQUENCE ha.effects_id_seq TO {p};
CREATE PROCEDURE ha.atomic(job text) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ha.effects (key, job) VALUES (radix.current_idempotency_key(), job);
    PERFORM pg_sleep(0.2);
END $$;
CREATE PROCEDURE ha.steps(job text) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ha.effects (key, job, step) VALUES (radix.current_idempotency_key(), job, 1);
    COMMIT;
    PERFORM pg_sleep(0.3);
    IF radix.once() THEN
        INSERT INTO ha.effects (key, job, step) VALUES (radix.current_idempotency_key(), job, 2);
    END IF;
    COMMIT;
    PERFORM pg_sleep(0.3);
    INSERT INTO ha.effects (key, job, step) VALUES (radix.current_idempotency_key(), job, 3);
    COMMIT;
END $$;
CREATE PROCEDURE ha.long(job text, seconds float8) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(seconds);
    INSERT INTO ha.effects (key, job) VALUES (radix.current_idempotency_key(), job);
END $$;
"""
FIRST_COMMIT = """
SELECT extract(epoch FROM min(finished_at))::float8 FROM radix.radix_system_job_history
WHERE finished_at >= to_timestamp(%s)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", default="switchover,kill,stall",
                        help="comma-separated, in order: switchover, kill, stall (default all three)")
    parser.add_argument("--settle", type=float, default=8.0,
                        help="seconds of steady running before each event and at the end (default 8)")
    parser.add_argument("--chain-seconds", type=float, default=3.0, help="each chain link's work (default 3 s)")
    parser.add_argument("--stall-hold", type=float, default=20.0,
                        help="seconds the stalled leader stays stopped after another member accepts writes "
                             "(default 20)")
    parser.add_argument("--ttl", type=int, default=20, help="Patroni's ttl (default 20; Patroni's own: 30)")
    parser.add_argument("--loop-wait", type=int, default=2, help="Patroni's loop_wait (default 2; its own: 10)")
    parser.add_argument("--retry-timeout", type=int, default=5, help="Patroni's retry_timeout (default 5)")


def _setup(cluster: PatroniCluster, chain_seconds: float) -> str:
    """The database, radixjobs installed through the multi-host DSN, the app and the jobs."""
    leader = cluster.leader()
    assert leader is not None
    with psycopg.connect(cluster.member_dsn(leader, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        cluster.add_role(conn, PRINCIPAL)
    dsn = f"{cluster.multi_host_dsn(DATABASE)} passfile={cluster.passfile}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.install(conn)
        conn.execute(sql.SQL(APP_SQL.replace("{p}", "{0}")).format(sql.Identifier(PRINCIPAL)))
        every = f"RUN AS {PRINCIPAL} CALL ha.%s WITH (history = 100000)"
        for index in (1, 2, 3):
            catalog.execute_job_ddl(conn, f"CREATE JOB ha.atomic{index} SCHEDULE EVERY INTERVAL '1 second' "
                                    + every % f"atomic('atomic{index}')")
        for index in (1, 2):
            catalog.execute_job_ddl(conn, f"CREATE JOB ha.steps{index} SCHEDULE EVERY INTERVAL '1 second' "
                                    + every % f"steps('steps{index}')")
        period = int(3 * chain_seconds + 1)
        catalog.execute_job_ddl(conn, f"CREATE JOB ha.chain_a SCHEDULE EVERY INTERVAL '{period} seconds' "
                                + every % f"long('chain_a', {chain_seconds})")
        for link, upstream in (("chain_b", "chain_a"), ("chain_c", "chain_b")):
            catalog.execute_job_ddl(conn, f"CREATE JOB ha.{link} SCHEDULE AFTER ha.{upstream} "
                                    + every % f"long('{link}', {chain_seconds})")
    return dsn


def _chain_done(conn: psycopg.Connection[Any]) -> float | None:
    """A moment (the database's clock) when every chain tick whose first link committed has its last one."""
    row = conn.execute("SELECT count(*) FILTER (WHERE job = 'chain_a'), count(*) FILTER (WHERE job = 'chain_c'), "
                       "extract(epoch FROM statement_timestamp())::float8 FROM ha.effects").fetchone()
    return float(row[2]) if row is not None and row[0] > 0 and row[0] == row[1] else None


def _new_leader(cluster: PatroniCluster, old: str, timeout: float = 180) -> tuple[str, float]:
    """The first member other than ``old`` to accept writes, and its clock then."""
    def found() -> tuple[str, float] | None:
        for member in cluster.live():
            at = None if member.name == old else cluster.read_write(member)
            if at is not None:
                return member.name, at
        return None
    return wait_for(found, timeout, "a new leader to accept writes", interval=0.1)


def _first_commit(cluster: PatroniCluster, leader: str, since: float, timeout: float) -> float | None:
    """The finish time of the first attempt committed on ``leader`` at or after ``since``, or None."""
    deadline = time.monotonic() + timeout
    dsn = cluster.member_dsn(cluster.member(leader), DATABASE)
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute(FIRST_COMMIT, (since,)).fetchone()
            if row is not None and row[0] is not None:
                return float(row[0])
        except psycopg.Error:
            pass
        time.sleep(0.1)
    return None


def _act(cluster: PatroniCluster, event: str, old: str) -> subprocess.Popen[str] | None:
    """Start the event against leader ``old``: a switchover runs in the background (patronictl)."""
    member = cluster.member(old)
    if event == "switchover":
        sync = next(name for name, role in cluster.roles().items() if role == "sync_standby")
        return subprocess.Popen(["patronictl", "-c", str(member.config), "switchover", "--leader", old,
                                 "--candidate", sync, "--force"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=cluster.root)
    if event == "kill":
        postmaster = member.postmaster()
        assert postmaster is not None, "the leader's postmaster is not running"
        postmaster.kill()
    elif event == "stall":
        cluster.freeze(member)
    else:
        raise ValueError(f"unknown event {event!r}")
    return None


def one_event(cluster: PatroniCluster, dsn: str, event: str, hold: float) -> tuple[dict[str, Any], check.Snapshot]:
    """The event, its timings, and what the old leader showed as committed just before it."""
    old = cluster.leader()
    assert old is not None
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = check.snapshot(conn)
    started = time.time()
    background = _act(cluster, event, old.name)
    new, writes_at = _new_leader(cluster, old.name)
    result: dict[str, Any] = {"event": event, "old_leader": old.name, "new_leader": new, "started_at": started,
                              "s_to_new_leader_writable": round(writes_at - started, 2)}
    first = _first_commit(cluster, new, writes_at, hold if event == "stall" else 120)
    if event == "stall":
        result["first_commit_while_old_leader_stopped"] = first is not None
        thawed_at = time.time()
        cluster.thaw(old)
        result["old_leader_stopped_s"] = round(thawed_at - started, 2)
        first = first or _first_commit(cluster, new, writes_at, 120)
        result["s_from_continue_to_first_commit"] = None if first is None else round(first - thawed_at, 2)
    result["s_to_first_commit_on_new_leader"] = None if first is None else round(first - writes_at, 2)
    if background is not None:
        output, _ = background.communicate(timeout=120)
        result["patronictl_exit"] = background.returncode
        if background.returncode:
            result["patronictl_output"] = output[-500:]
    return result, before


def _events(cluster: PatroniCluster, dsn: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]],
                                                                                 list[check.Snapshot]]:
    events, befores = [], []
    for event in [e.strip() for e in args.events.split(",") if e.strip()]:
        wait_for(cluster.healthy, 240, "every member back, one synchronous", interval=0.5)
        time.sleep(args.settle)
        result, before = one_event(cluster, dsn, event, args.stall_hold)
        events.append(result)
        befores.append(before)
    wait_for(cluster.healthy, 240, "every member back, one synchronous", interval=0.5)
    time.sleep(args.settle)
    return events, befores


def _verdict(final: check.Snapshot, events: list[dict[str, Any]], befores: list[check.Snapshot],
             chain_done_at: float) -> dict[str, Any]:
    bounds = [e["started_at"] for e in events]
    total, per_window = check.duplicates(final, bounds)
    non_atomic = check.non_atomic(final, bounds)
    for index, (event, before) in enumerate(zip(events, befores, strict=True)):
        event["atomic_duplicates"] = per_window[index]
        event["lost"] = check.lost(before, final)
        event["non_atomic"] = non_atomic[index]
        event["chain_links_in_flight"] = check.chain(final, before, chain_done_at)["links_in_flight"]
    lost_total = sum(sum(e["lost"].values()) for e in events)
    matches = check.history_matches_effects(final)
    chain = check.chain(final, check.Snapshot(), chain_done_at)
    violations = {"atomic_duplicates": total, "lost": lost_total, **matches,
                  "chain_ticks_incomplete": chain["ticks_incomplete"],
                  "non_atomic_ticks_unfinished": sum(len(w["ticks_unfinished"]) for w in non_atomic)}
    return {"violations": violations, "violations_total": sum(violations.values()),
            "chain_ticks_complete": chain["ticks_complete"], "effects": len(final.effects),
            "attempts": len(final.history)}


def run_own_servers(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """The scenario on its own Patroni cluster (bench/run.py does not make a server for it)."""
    missing = tools_missing()
    if missing:
        raise SystemExit(f"ha needs {', '.join(missing)} (Debian: apt-get install patroni etcd-server postgresql-15)")
    with patroni_cluster(Timing(args.ttl, args.loop_wait, args.retry_timeout)) as cluster:
        dsn = _setup(cluster, args.chain_seconds)
        daemons = [Daemon(dsn, f"ha-node{i}") for i in range(2)]
        exits: list[int | None] = []
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                wait_for(lambda: _chain_done(conn), 120, "a first chain a → b → c", interval=0.5)
            events, befores = _events(cluster, dsn, args)
            with psycopg.connect(dsn, autocommit=True) as conn:
                chain_done_at = wait_for(lambda: _chain_done(conn), 120, "the chain in flight to finish",
                                         interval=0.2)
            exits = [d.proc.poll() for d in daemons]  # None: still serving, as it should
        finally:
            for daemon in daemons:
                daemon.stop()
        with psycopg.connect(dsn, autocommit=True) as conn:
            final = check.snapshot(conn)
            version = conn.execute("SELECT current_setting('server_version')").fetchone()
        verdict = _verdict(final, events, befores, chain_done_at)
        verdict["violations"]["daemon_exits_during_run"] = sum(code is not None for code in exits)
        verdict["violations"]["unclean_stops"] = sum(d.proc.returncode != 0 for d in daemons)
        verdict["violations_total"] = sum(verdict["violations"].values())
        setup = {"members": len(cluster.members), "ttl": args.ttl, "loop_wait": args.loop_wait,
                 "retry_timeout": args.retry_timeout, "synchronous_mode": True, "daemons": len(daemons),
                 "superuser": SUPERUSER}
    for event in events:
        del event["started_at"]
    return {"ha": {"setup": setup, "events": events, **verdict}}, None if version is None else str(version[0])
