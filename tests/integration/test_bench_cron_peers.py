"""``bench/run.py compare``'s pg_cron and pgAgent peers on a pg_cron cluster (bench/distribution.py): each defines
its jobs as the workload says, runs its scheduler on ``go`` and removes its jobs on ``stop``. No minute is
waited for and no timing is asserted. Skips without the distribution's pg_cron (``postgresql-15-cron``) or
pgAgent (``pgagent``), which .ci/run does not install: the peers are bench code, not the product.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

pytest.importorskip("psutil")  # the bench extra (bench/harness.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from distribution import pg_cron_bin, pg_cron_cluster
from harness import with_dbname
from peers import PeerProcess

BIN = pg_cron_bin()
pytestmark = pytest.mark.skipif(BIN is None, reason="no distribution pg_cron (Debian: postgresql-15-cron)")
MINUTE = 3600.0 * 400 + 60 * 17  # some hour's minute 17


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, str]]:
    """(superuser DSN of pg_cron's database, superuser DSN of the bench database)."""
    assert BIN is not None
    with pg_cron_cluster(BIN) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(b"CREATE DATABASE bench_peers")
            conn.execute(b"CREATE ROLE bench_worker LOGIN")
        yield dsn, with_dbname(dsn, "bench_peers")


def test_pg_cron_peer_schedules_in_the_bench_database_and_unschedules(cluster: tuple[str, str]) -> None:
    admin, bench = cluster
    peer = PeerProcess("pg_cron", bench, "minute-burst", 3, 32, "--minute", str(MINUTE), "--work-ms", "5",
                       "--run-as", "bench_worker")
    try:
        peer.ready(60)
        with psycopg.connect(admin) as conn:
            jobs = conn.execute(b"SELECT jobname, schedule, command, database, username, active FROM cron.job "
                                b"ORDER BY jobname").fetchall()
        assert jobs == [(f"bench-{i}", "17 * * * *", f"CALL bench.cron_work({i}, 5)", "bench_peers", "bench_worker",
                         True) for i in range(3)]
        peer.go()
    finally:
        peer.stop()
    assert peer.proc.returncode == 0
    with psycopg.connect(admin) as conn:
        assert conn.execute(b"SELECT count(*) FROM cron.job").fetchone() == (0,)


@pytest.mark.skipif(shutil.which("pgagent") is None, reason="no pgagent binary (Debian: pgagent)")
def test_pgagent_peer_defines_its_jobs_and_runs_the_agent(cluster: tuple[str, str]) -> None:
    _, bench = cluster
    peer = PeerProcess("pgagent", bench, "minutely", 2, 32, "--minute", str(MINUTE), "--work-ms", "5",
                       "--run-as", "bench_worker")
    try:
        peer.ready(60)
        with psycopg.connect(bench) as conn:
            jobs = conn.execute(b"SELECT j.jobname, s.jstcode, s.jstconnstr LIKE '%user=bench_worker%', "
                                b"j.jobnextrun = date_trunc('minute', j.jobnextrun) "  # a whole minute, the next
                                b"AND j.jobnextrun BETWEEN now() - interval '1 minute' AND now() + interval '1 minute' "
                                b"FROM pgagent.pga_job j JOIN pgagent.pga_jobstep s ON s.jstjobid = j.jobid "
                                b"ORDER BY j.jobname").fetchall()
            assert jobs == [(f"bench-{i}", f"CALL bench.cron_work({i}, 5)", True, True) for i in range(2)]
            peer.go()
            deadline = time.monotonic() + 30
            while conn.execute(b"SELECT count(*) FROM pgagent.pga_jobagent").fetchone() != (1,):
                assert time.monotonic() < deadline, "pgagent did not register"
                time.sleep(0.2)
    finally:
        peer.stop()
    assert peer.proc.returncode == 0
