"""The chaos run's world: a private embedded PostgreSQL, one database, a principal, the procedures that
record their effects, ~150 jobs of every kind (chains and fan-ins of SCHEDULE AFTER jobs, two job groups among
them) and a few CRON_TABLE documents.

Every effect row says which job and tick it belongs to (job id, idempotency key), the attempt number,
the backend pid, and the procedure's own start and end (clock_timestamp(); a grouped job's start is its
transaction's, now()), so the checks can find duplicates and overlaps from the effects alone.
``chaos.ledger`` keeps every history row the engine writes (an AFTER trigger on
radix.radix_system_job_history, which itself is pruned to 256 rows per job), so ticks can be accounted for
over runs of any length.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from radixjobs import catalog, documents, migrate
from radixjobs.embedded import EmbeddedServer

PRINCIPAL = "chaos_worker"
DATABASE = "chaos"

APP_SQL = """
CREATE SCHEMA chaos;
CREATE TABLE chaos.effects (id bigserial PRIMARY KEY, kind text NOT NULL, job uuid, key text, attempt int,
                            pid int NOT NULL, once boolean, started timestamptz NOT NULL,
                            finished timestamptz NOT NULL);
CREATE TABLE chaos.doc_effects (id bigserial PRIMARY KEY, num text NOT NULL, pid int NOT NULL,
                                started timestamptz NOT NULL, finished timestamptz NOT NULL);
CREATE TABLE chaos.ledger (history_id bigint, job_id uuid, planned_ns bigint, attempt int, status text,
                           node text, started_at timestamptz, finished_at timestamptz, error jsonb,
                           run_kind text, key text, logged_at timestamptz DEFAULT clock_timestamp());
CREATE INDEX ON chaos.ledger (job_id, status);
CREATE FUNCTION chaos.log_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO chaos.ledger (history_id, job_id, planned_ns, attempt, status, node, started_at, finished_at, error,
                            run_kind, key)
  VALUES (NEW.history_id, NEW.job_id, NEW.planned_ns, NEW.attempt, NEW.status, NEW.node, NEW.started_at,
          NEW.finished_at, NEW.error, NEW.run_kind, NEW.idempotency_key);
  RETURN NULL;
END $$;
CREATE TRIGGER chaos_ledger AFTER INSERT OR UPDATE OF status ON radix.radix_system_job_history
  FOR EACH ROW EXECUTE FUNCTION chaos.log_history();

-- exactly once: the effect commits with the tick's completion marker
CREATE PROCEDURE chaos.atomic(kind text, max_ms int) LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
BEGIN
  PERFORM pg_sleep(random() * max_ms / 1000.0);
  INSERT INTO chaos.effects (kind, job, key, attempt, pid, started, finished)
  VALUES (kind, radix.current_job_id(), radix.current_idempotency_key(), radix.current_job_attempt(),
          pg_backend_pid(), t0, clock_timestamp());
END $$;

-- at least once: commits inside; radix.once() says whether this tick's effect is new
CREATE PROCEDURE chaos.non_atomic(kind text, max_ms int) LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
BEGIN
  PERFORM pg_sleep(random() * max_ms / 1000.0);
  INSERT INTO chaos.effects (kind, job, key, attempt, pid, once, started, finished)
  VALUES (kind, radix.current_job_id(), radix.current_idempotency_key(), radix.current_job_attempt(),
          pg_backend_pid(), radix.once(), t0, clock_timestamp());
  COMMIT;
END $$;

-- a serialization failure on the first 0..2 attempts of a tick (chosen by its key), then success
CREATE PROCEDURE chaos.conflict(kind text, max_ms int) LANGUAGE plpgsql AS $$
BEGIN
  CALL chaos.atomic(kind, max_ms);
  IF radix.current_job_attempt() <= abs(hashtext(radix.current_idempotency_key())) % 3 THEN
    RAISE EXCEPTION 'chaos conflict' USING ERRCODE = '40001';
  END IF;
END $$;

-- a terminal failure on a quarter of the ticks (chosen by the key), success otherwise: both SUCCEEDS and FAILS
-- edges fire from it
CREATE PROCEDURE chaos.flaky(kind text, max_ms int) LANGUAGE plpgsql AS $$
BEGIN
  CALL chaos.atomic(kind, max_ms);
  IF abs(hashtext(radix.current_idempotency_key())) % 4 = 0 THEN
    RAISE EXCEPTION 'chaos flaky failure';
  END IF;
END $$;

-- atomic, its span from the transaction's start (inside the claim that holds the group's place) to its end
CREATE PROCEDURE chaos.grouped(kind text, max_ms int) LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_sleep(random() * max_ms / 1000.0);
  INSERT INTO chaos.effects (kind, job, key, attempt, pid, started, finished)
  VALUES (kind, radix.current_job_id(), radix.current_idempotency_key(), radix.current_job_attempt(),
          pg_backend_pid(), now(), clock_timestamp());
END $$;

-- a terminal failure every time (its effect is rolled back)
CREATE PROCEDURE chaos.fail(kind text, max_ms int) LANGUAGE plpgsql AS $$
BEGIN
  CALL chaos.atomic(kind, max_ms);
  RAISE EXCEPTION 'chaos failure';
END $$;
"""

DOC_FUNCTION = """
CREATE FUNCTION chaos.{name}() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
BEGIN
  PERFORM pg_sleep(random() * 0.1);
  INSERT INTO chaos.doc_effects (num, pid, started, finished) VALUES ({num}, pg_backend_pid(), t0, clock_timestamp());
  IF {fails} THEN RAISE EXCEPTION 'chaos document failure'; END IF;
END $$
"""

GRANTS = ["GRANT USAGE ON SCHEMA chaos TO {p}", "GRANT INSERT ON chaos.effects, chaos.doc_effects TO {p}",
          "GRANT USAGE ON SEQUENCE chaos.effects_id_seq, chaos.doc_effects_id_seq TO {p}"]

# (kind, procedure, count, schedule maker); kinds are the effect kinds the checks know
INTERVAL_KINDS = [("atomic", "chaos.atomic", 40), ("non_atomic", "chaos.non_atomic", 15),
                  ("conflict", "chaos.conflict", 10), ("fail", "chaos.fail", 5)]
# atomic jobs WITH (batch = on) whose procedure sleeps at most QUICK_MS, all EVERY 1 second from the same start:
# due together, short enough to run in batches of ticks (engine/batches.py) whenever they queue up behind the
# free slots
QUICK_JOBS = 40
QUICK_MS = 2
CRON_JOBS = 10
AT_JOBS = 10
DOCUMENTS = 10
FAILING_DOCUMENTS = 2
MAX_MS = 100  # the longest sleep inside a procedure
# chains and a fan-in: two upstreams EVERY 1 second on one grid (chain_a fails a quarter of its ticks, chain_x
# raises 40001 on its first 0..2 attempts), then dependent -> [(upstream, edge condition)], in creation order
CHAIN_UPSTREAMS = [("chaos.chain_a", "chaos.flaky", "flaky"), ("chaos.chain_x", "chaos.conflict", "conflict")]
CHAIN_DEPENDENTS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("chaos.after_b", "chaos.flaky", "flaky", [("chaos.chain_a", "succeeds")]),
    ("chaos.after_c", "chaos.atomic", "atomic", [("chaos.after_b", "succeeds")]),
    ("chaos.after_f", "chaos.atomic", "atomic", [("chaos.chain_a", "fails")]),
    ("chaos.after_d", "chaos.atomic", "atomic", [("chaos.after_b", "completes"), ("chaos.chain_x", "succeeds")]),
    ("chaos.after_n", "chaos.non_atomic", "non_atomic", [("chaos.chain_x", "completes")]),
]
# job groups: name -> (max_running, jobs); their jobs run EVERY 1 second in step, each up to GROUP_MS
GROUPS = {"chaos_pair": (2, 6), "chaos_solo": (1, 3)}
GROUP_MS = 200


@dataclass
class World:
    """What the run made: where it is and what the checks need to know about each job."""

    dsn: str
    server: EmbeddedServer
    home: Path
    kinds: dict[str, str] = field(default_factory=dict)          # job name -> effect kind
    every_ns: dict[str, int] = field(default_factory=dict)       # job name -> grid step (every and cron)
    at_jobs: dict[str, float] = field(default_factory=dict)      # AT job name -> seconds from now at creation
    at_incarnations: list[dict[str, Any]] = field(default_factory=list)  # every AT job ever made
    doc_nums: list[str] = field(default_factory=list)
    edges: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # dependent -> (upstream, condition)
    groups: dict[str, tuple[int, list[str]]] = field(default_factory=dict)  # group -> (max_running, job names)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


@contextlib.contextmanager
def chaos_world(rng: random.Random, keep: bool = False) -> Iterator[World]:
    """A private server in a temporary home with the chaos database; destroyed afterwards unless ``keep``."""
    home = Path(tempfile.mkdtemp(prefix="radix-chaos-"))
    server = EmbeddedServer(home / "home", settings={"max_connections": "400"})
    info, _ = server.ensure_running(persistent=True)
    try:
        with psycopg.connect(info.dsn(), autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(PRINCIPAL)))
        world = World(with_dbname(info.dsn(), DATABASE), server, home)
        with world.connect() as conn:
            migrate.install(conn)
            conn.execute(APP_SQL.encode())
            for grant in GRANTS:
                conn.execute(grant.format(p=PRINCIPAL).encode())
            make_jobs(world, conn, rng)
        make_documents(world, rng)
        yield world
    finally:
        if not keep:
            server.destroy()
            shutil.rmtree(home, ignore_errors=True)  # the daemons' logs too


def _job(conn: psycopg.Connection[Any], name: str, schedule: str, procedure: str, kind: str,
         max_ms: int = MAX_MS, options: str = "") -> None:
    catalog.execute_job_ddl(conn, f"CREATE JOB {name} SCHEDULE {schedule} RUN AS {PRINCIPAL} "
                                  f"CALL {procedure}('{kind}', {max_ms}) {options}")


def make_jobs(world: World, conn: psycopg.Connection[Any], rng: random.Random) -> None:
    """Interval jobs of every kind (1–3 s), quick atomic jobs (1 s, in step), 6-field CRON jobs (every 2, 3 or
    5 s), AT jobs, chains and job groups."""
    for kind, procedure, count in INTERVAL_KINDS:
        for i in range(count):
            name, seconds = f"chaos.{kind}_{i}", rng.choice([1, 2, 3])
            _job(conn, name, f"EVERY INTERVAL '{seconds} seconds'", procedure, kind)
            world.kinds[name], world.every_ns[name] = kind, seconds * 10**9
    start = conn.execute("SELECT date_trunc('second', clock_timestamp()) + interval '1 second'").fetchone()
    assert start is not None
    for i in range(QUICK_JOBS):
        name = f"chaos.quick_{i}"
        _job(conn, name, _every_second_from(start[0]), "chaos.atomic", "atomic", QUICK_MS, "WITH (batch = on)")
        world.kinds[name], world.every_ns[name] = "atomic", 10**9
    for i in range(CRON_JOBS):
        name, seconds = f"chaos.cron_{i}", rng.choice([2, 3, 5])
        _job(conn, name, f"CRON '*/{seconds} * * * * *'", "chaos.atomic", "cron")
        world.kinds[name], world.every_ns[name] = "cron", seconds * 10**9
    for i in range(AT_JOBS):
        name = f"chaos.at_{i}"
        world.kinds[name] = "at"
        world.at_jobs[name] = -rng.uniform(1, 60) if i % 2 == 0 else rng.uniform(2, 8)
        create_at_job(world, conn, name, world.at_jobs[name])
    make_chains(world, conn, start[0])
    make_groups(world, conn, start[0])


def _every_second_from(start: dt.datetime) -> str:
    return f"EVERY INTERVAL '1 second' STARTING AT TIMESTAMP '{start.astimezone(dt.UTC).isoformat()}'"


def make_chains(world: World, conn: psycopg.Connection[Any], start: dt.datetime) -> None:
    """The chain upstreams (on one grid, so a fan-in can meet), then their dependents."""
    for name, procedure, kind in CHAIN_UPSTREAMS:
        _job(conn, name, _every_second_from(start), procedure, kind)
        world.kinds[name], world.every_ns[name] = kind, 10**9
    for name, procedure, kind, upstreams in CHAIN_DEPENDENTS:
        after = " AND ".join(f"{upstream} {condition.upper()}" for upstream, condition in upstreams)
        _job(conn, name, f"AFTER {after}", procedure, kind)
        world.kinds[name], world.edges[name] = kind, upstreams


def make_groups(world: World, conn: psycopg.Connection[Any], start: dt.datetime) -> None:
    """Job groups whose jobs are all due at once every second, more than max_running of them."""
    for group, (max_running, count) in GROUPS.items():
        catalog.execute_job_ddl(conn, f"CREATE JOB GROUP {group} WITH (max_running = {max_running})")
        names = [f"chaos.{group.removeprefix('chaos_')}_{i}" for i in range(count)]
        for name in names:
            _job(conn, name, _every_second_from(start), "chaos.grouped", "grouped", GROUP_MS,
                 f"WITH (group = '{group}')")
            world.kinds[name], world.every_ns[name] = "grouped", 10**9
        world.groups[group] = (max_running, names)


def create_at_job(world: World, conn: psycopg.Connection[Any], name: str, offset_s: float) -> None:
    """(Re-)create a one-time job due ``offset_s`` seconds from the database's now (negative: past)."""
    row = conn.execute("SELECT clock_timestamp() + make_interval(secs => %s)", (offset_s,)).fetchone()
    assert row is not None
    at: dt.datetime = row[0]
    _job(conn, name, f"AT TIMESTAMP '{at.astimezone(dt.UTC).isoformat()}'", "chaos.atomic", "at")
    job = catalog.get_job(conn, name)
    assert job is not None
    world.at_incarnations.append({"name": name, "job_id": job["job_id"], "at": at})


def make_documents(world: World, rng: random.Random) -> None:
    """CRON_TABLE documents (DB_FUNCTION, every 1–3 s), written by the principal itself."""
    with world.connect() as conn:
        for i in range(DOCUMENTS):
            num = str(900 + i)
            conn.execute(DOC_FUNCTION.format(name=f"doc_{num}", num=f"'{num}'",
                                             fails="true" if i < FAILING_DOCUMENTS else "false").encode())
            conn.execute(f"GRANT EXECUTE ON FUNCTION chaos.doc_{num}() TO {PRINCIPAL}".encode())
            world.doc_nums.append(num)
    seconds = [rng.choice([1, 2, 3]) for _ in world.doc_nums]
    docs = [{"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
        "NUM": int(num), "DESCR": f"chaos document {num}", "DB_FUNCTION": f"chaos.doc_{num}",
        "INTERVAL": f"NOW() + INTERVAL '{s} seconds'", "INTERVAL_ERROR": f"NOW() + INTERVAL '{s} seconds'"}}
        for num, s in zip(world.doc_nums, seconds, strict=True)]
    with psycopg.connect(world.dsn, user=PRINCIPAL, autocommit=True) as conn:
        documents.apply(conn, docs)
