"""A primary and a streaming standby from the distribution's PostgreSQL, for failover tests (docs/failover.md).

Invariants: both clusters are made as tests/external.py makes one (a fresh /tmp directory each, 127.0.0.1
only, a free port and an own socket directory each, scram-sha-256 for every login, run as the ``postgres``
OS user when root). The standby is a ``pg_basebackup -R`` copy of the primary streaming from it; once
``synchronous`` is set up, the primary's ``synchronous_standby_names`` names the standby, so every commit
the primary acknowledges (and every commit another session of the primary can see) is on the standby's
disk too. The standby's own copy of the setting is empty: after a promotion it does not wait for a
standby it does not have. Both are stopped and removed when the test ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.external import (
    SUPERUSER,
    ExternalCluster,
    _as_postgres,
    _free_port,
    distribution_bin,
    setup_scheduler,
    start_cluster,
    stop_cluster,
)
from tests.support import wait_for

STANDBY_NAME = "radix_standby"


@dataclass
class Pair:
    """A primary and its standby; ``passwords`` are shared (the roles are replicated)."""

    primary: ExternalCluster
    standby: ExternalCluster

    def multi_host_dsn(self, user: str, dbname: str) -> str:
        """The libpq multi-host DSN naming both members, which connects to whichever accepts writes."""
        return (f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} dbname={dbname} "
                f"user={user} target_session_attrs=read-write connect_timeout=5")

    def allow_everywhere(self, role: str) -> None:
        """The role's password in the password file for every port (either member may be the primary)."""
        line = f"127.0.0.1:*:*:{role}:{self.primary.passwords[role]}\n"
        for cluster in (self.primary, self.standby):
            with cluster.passfile.open("a", encoding="utf-8") as fh:
                fh.write(line)


def _pg_run(cluster: ExternalCluster, tool: str, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([str(cluster.bin / tool), *args], check=True, capture_output=True, cwd="/",
                   env={**os.environ, **(env or {})}, **_as_postgres())


def start_standby(primary: ExternalCluster) -> ExternalCluster:
    """``pg_basebackup -R`` of ``primary`` into a fresh directory, on its own port, started and streaming."""
    root = Path(tempfile.mkdtemp(prefix="radixjobs-standby-", dir="/tmp"))
    standby = ExternalCluster(root, primary.bin, _free_port(), passwords=primary.passwords)
    os.chmod(root, 0o711)
    run = root / "run"
    for directory in (standby.datadir, run):
        directory.mkdir(mode=0o700)
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres", "postgres")
    # the replication connection's password: in a password file only the server's OS user reads
    walpass = root / "walpass"
    walpass.write_text(f"127.0.0.1:{primary.port}:*:{SUPERUSER}:{primary.passwords[SUPERUSER]}\n",
                       encoding="utf-8")
    os.chmod(walpass, 0o600)
    if os.geteuid() == 0:
        shutil.chown(walpass, "postgres", "postgres")
    _pg_run(primary, "pg_basebackup", "-D", str(standby.datadir), "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", SUPERUSER, "-X", "stream", "-c", "fast", "-R", "-w", env={"PGPASSFILE": str(walpass)})
    with (standby.datadir / "postgresql.conf").open("a", encoding="utf-8") as fh:
        fh.write(f"\nport = {standby.port}\nunix_socket_directories = '{run}'\ncluster_name = '{STANDBY_NAME}'\n"
                 "synchronous_standby_names = ''\n")
    with (standby.datadir / "postgresql.auto.conf").open("a", encoding="utf-8") as fh:
        # pg_basebackup -R wrote primary_conninfo; ours names the password file and the standby
        fh.write(f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user={SUPERUSER} "
                 f"passfile={walpass} application_name={STANDBY_NAME}'\n")
    standby.passfile.touch(mode=0o600)
    standby.ctl("-l", str(standby.datadir / "server.log"), "start")
    return standby


def make_synchronous(primary: ExternalCluster) -> None:
    """Commits on the primary wait for the standby's flush; returns once the standby is the sync one."""
    with primary.admin("postgres") as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 ({STANDBY_NAME})'")
        conn.execute("SELECT pg_reload_conf()")
        wait_for(lambda: conn.execute("SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                                      (STANDBY_NAME,)).fetchone() == ("sync",),
                 timeout=60, message="the standby to be synchronous")


def replicated_pair() -> Iterator[Pair]:
    """The fixture's body: a primary with the scheduler role (tests/external.py), its synchronous standby."""
    bin_dir = distribution_bin()
    assert bin_dir is not None
    primary = start_cluster(bin_dir)
    standby = None
    try:
        with (primary.datadir / "pg_hba.conf").open("a", encoding="utf-8") as fh:
            fh.write(f"host replication {SUPERUSER} 127.0.0.1/32 scram-sha-256\n")
        primary.ctl("reload")
        setup_scheduler(primary)
        standby = start_standby(primary)
        make_synchronous(primary)
        yield Pair(primary, standby)
    finally:
        if standby is not None:
            stop_cluster(standby)
        try:
            stop_cluster(primary)
        except subprocess.CalledProcessError:  # stopped by the test already
            shutil.rmtree(primary.root, ignore_errors=True)
