"""A Patroni cluster on this machine for ``bench/run.py ha`` (docs/failover.md): one etcd and three Patroni
members managing the distribution's PostgreSQL 15, ``synchronous_mode`` on.

Invariants: everything listens on 127.0.0.1 only (etcd's client and peer URLs, Patroni's REST API,
PostgreSQL's ``listen_addresses``) on free ports, and lives in one fresh directory under /tmp; every login
is scram-sha-256. Run as root, Patroni and PostgreSQL run as the ``postgres`` OS user (PostgreSQL refuses
root). ``patroni_cluster`` stops every process it started on the way out, failure or not: frozen ones are
continued, Patroni's and etcd's process groups are killed, and each member's postmaster (Patroni starts it in
a session of its own) is killed with its children, found by its data directory.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from distribution import as_postgres
from harness import wait_for

SCOPE = "radix-ha"
SUPERUSER = "radix_admin"


def tools_missing() -> list[str]:
    """What this machine lacks to run the stack: Debian's patroni, etcd-server and postgresql-15."""
    missing = [tool for tool in ("patroni", "patronictl", "etcd") if shutil.which(tool) is None]
    if pg_bin() is None:
        missing.append("postgresql-15")
    return missing


def pg_bin() -> Path | None:
    found = glob.glob("/usr/lib/postgresql/15/bin/postgres")
    return Path(found[0]).parent if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _own(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


@dataclass
class Timing:
    """Patroni's dynamic settings that decide how fast a dead leader is replaced (docs/failover.md)."""

    ttl: int = 20
    loop_wait: int = 2
    retry_timeout: int = 5


@dataclass
class Member:
    """One Patroni member: its REST API, its PostgreSQL, and its Patroni process."""

    name: str
    root: Path
    pg_port: int
    api_port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def config(self) -> Path:
        return self.root / "patroni.yml"

    def api(self, path: str, timeout: float = 2.0) -> tuple[int, Any]:
        """GET on the REST API: the status and the JSON body (status 0 when it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}{path}", timeout=timeout) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except (OSError, ValueError):
            return 0, None

    def postmaster(self) -> psutil.Process | None:
        """The member's running postmaster: a ``postgres`` process whose command line names its data directory."""
        for process in psutil.process_iter(["name", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if process.info["name"] == "postgres" and str(self.datadir) in (process.info["cmdline"] or []):
                    return process
        return None

    def processes(self) -> list[psutil.Process]:
        """Patroni (and what it runs) and the postmaster with its backends: the member as a host would be."""
        found: list[psutil.Process] = []
        roots = [self.proc.pid] if self.proc is not None and self.proc.poll() is None else []
        postmaster = self.postmaster()
        if postmaster is not None:
            roots.append(postmaster.pid)
        for pid in roots:
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                found += [process, *process.children(recursive=True)]
        return found

    def signal_all(self, signum: int) -> None:
        for process in self.processes():
            with contextlib.suppress(psutil.Error):
                process.send_signal(signum)


@dataclass
class PatroniCluster:
    """etcd and the members; ``passwords`` of the roles Patroni made and those added with ``add_role``."""

    root: Path
    members: list[Member]
    etcd_port: int
    passwords: dict[str, str] = field(default_factory=dict)
    frozen: set[str] = field(default_factory=set)

    @property
    def passfile(self) -> Path:
        return self.root / "pgpass"

    def multi_host_dsn(self, dbname: str, user: str = SUPERUSER) -> str:
        """Every member, and only a read-write session will do (docs/failover.md)."""
        hosts = ",".join("127.0.0.1" for _ in self.members)
        ports = ",".join(str(m.pg_port) for m in self.members)
        return (f"host={hosts} port={ports} dbname={dbname} user={user} target_session_attrs=read-write "
                "connect_timeout=3 keepalives_idle=10 keepalives_interval=3 keepalives_count=3 "
                "tcp_user_timeout=10000")

    def member_dsn(self, member: Member, dbname: str, user: str = SUPERUSER) -> str:
        return make_conninfo(host="127.0.0.1", port=member.pg_port, dbname=dbname, user=user,
                             password=self.passwords[user], connect_timeout=2)

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    def live(self) -> list[Member]:
        return [m for m in self.members if m.name not in self.frozen]

    def roles(self) -> dict[str, str]:
        """Each member's role as Patroni's cluster view says (leader, sync_standby, replica), asked of a
        member that is not frozen; empty when none answers."""
        for member in self.live():
            status, body = member.api("/cluster")
            if status == 200 and body:
                return {m["name"]: m["role"] for m in body.get("members", [])}
        return {}

    def leader(self) -> Member | None:
        name = next((n for n, role in self.roles().items() if role == "leader"), None)
        return None if name is None else self.member(name)

    def healthy(self) -> bool:
        """One leader, one synchronous standby, every member streaming or running."""
        for member in self.live():
            status, body = member.api("/cluster")
            if status == 200 and body:
                members = body.get("members", [])
                roles = sorted(m["role"] for m in members)
                running = all(m.get("state") in ("running", "streaming") for m in members)
                return (running and len(members) == len(self.members) and roles.count("leader") == 1
                        and roles.count("sync_standby") == 1)
        return False

    def read_write(self, member: Member) -> float | None:
        """The member's clock (epoch seconds) when it answers as a primary, else None."""
        try:
            with psycopg.connect(self.member_dsn(member, "postgres"), autocommit=True) as conn:
                row = conn.execute("SELECT pg_is_in_recovery(), extract(epoch FROM clock_timestamp())::float8"
                                   ).fetchone()
        except psycopg.Error:
            return None
        return None if row is None or row[0] else float(row[1])

    def patronictl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["patronictl", "-c", str(self.members[0].config), *args], capture_output=True,
                              text=True, timeout=120, check=False, cwd=self.root, env=_patroni_env(self.root),
                              **as_postgres())

    def freeze(self, member: Member) -> None:
        """SIGSTOP of Patroni and PostgreSQL: the member answers nothing, its sockets stay open."""
        self.frozen.add(member.name)
        member.signal_all(signal.SIGSTOP)

    def thaw(self, member: Member) -> None:
        member.signal_all(signal.SIGCONT)
        self.frozen.discard(member.name)

    def add_role(self, conn: psycopg.Connection[Any], name: str) -> None:
        """A LOGIN role with a password, in the password file for every member's port."""
        password = secrets.token_urlsafe(18)
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(password)))
        self.passwords[name] = password
        with self.passfile.open("a", encoding="utf-8") as fh:
            fh.write(f"127.0.0.1:*:*:{name}:{password}\n")


def _patroni_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PATRONI"))}
    return {**env, "HOME": str(root), "PATRONICTL_CONFIG_FILE": str(root / "m1" / "patroni.yml")}


def _member_config(cluster: PatroniCluster, member: Member, timing: Timing, bin_dir: Path) -> dict[str, Any]:
    """patroni.yml of one member (JSON is YAML): docs/failover.md shows the same settings."""
    return {
        "scope": SCOPE,
        "name": member.name,
        "log": {"level": "INFO"},
        "restapi": {"listen": f"127.0.0.1:{member.api_port}", "connect_address": f"127.0.0.1:{member.api_port}"},
        "etcd3": {"hosts": [f"127.0.0.1:{cluster.etcd_port}"]},
        "bootstrap": {
            "dcs": {
                "ttl": timing.ttl, "loop_wait": timing.loop_wait, "retry_timeout": timing.retry_timeout,
                "synchronous_mode": True, "synchronous_mode_strict": False, "synchronous_node_count": 1,
                "maximum_lag_on_failover": 1048576,
                # a crashed primary is failed over to the synchronous standby, not restarted in place
                "primary_start_timeout": 0,
                "postgresql": {"use_pg_rewind": True, "use_slots": True,
                               "parameters": {"synchronous_commit": "on", "wal_log_hints": "on",
                                              "max_connections": 100, "password_encryption": "scram-sha-256"}},
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, {"auth-host": "scram-sha-256"},
                       {"auth-local": "scram-sha-256"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{member.pg_port}",
            "connect_address": f"127.0.0.1:{member.pg_port}",
            "data_dir": str(member.datadir),
            "bin_dir": str(bin_dir),
            "pgpass": str(member.root / "pgpass.patroni"),
            "authentication": {
                "superuser": {"username": SUPERUSER, "password": cluster.passwords[SUPERUSER]},
                "replication": {"username": "radix_replicator", "password": cluster.passwords["radix_replicator"]},
                "rewind": {"username": "radix_rewind", "password": cluster.passwords["radix_rewind"]},
            },
            "parameters": {"unix_socket_directories": str(member.root / "run")},
            "pg_hba": ["local all all scram-sha-256",
                       "host replication radix_replicator 127.0.0.1/32 scram-sha-256",
                       "host all all 127.0.0.1/32 scram-sha-256"],
        },
    }


def _start_etcd(cluster: PatroniCluster, logs: list[Any]) -> subprocess.Popen[bytes]:
    peer = free_port()
    client = f"http://127.0.0.1:{cluster.etcd_port}"
    log = (cluster.root / "etcd.log").open("wb")
    logs.append(log)
    proc = subprocess.Popen(
        ["etcd", "--name", "etcd0", "--data-dir", str(cluster.root / "etcd"), "--listen-client-urls", client,
         "--advertise-client-urls", client, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"etcd0=http://127.0.0.1:{peer}", "--initial-cluster-state", "new"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=cluster.root)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"etcd exited {proc.returncode}: {(cluster.root / 'etcd.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{client}/health", timeout=1) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    wait_for(up, 30, "etcd", interval=0.2)
    return proc


def _start_member(cluster: PatroniCluster, member: Member, logs: list[Any]) -> None:
    log = (member.root / "patroni.log").open("wb")
    logs.append(log)
    member.proc = subprocess.Popen(["patroni", str(member.config)], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=member.root, env=_patroni_env(cluster.root),
                                   **as_postgres())


def _stop(cluster: PatroniCluster, etcd: subprocess.Popen[bytes] | None) -> None:
    """Every process of the stack, whatever state it is in (frozen ones included)."""
    for member in cluster.members:
        member.signal_all(signal.SIGCONT)
        if member.proc is not None and member.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(member.proc.pid, signal.SIGKILL)
            member.proc.wait(10)
    for member in cluster.members:  # their postmasters, which Patroni started in sessions of their own
        for _ in range(3):
            postmaster = member.postmaster()
            if postmaster is None:
                break
            for process in [*postmaster.children(recursive=True), postmaster]:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            with contextlib.suppress(psutil.Error):
                postmaster.wait(10)
    if etcd is not None and etcd.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(etcd.pid, signal.SIGKILL)
        etcd.wait(10)


@contextlib.contextmanager
def patroni_cluster(timing: Timing | None = None, members: int = 3) -> Iterator[PatroniCluster]:
    """etcd and ``members`` Patroni members bootstrapped and streaming, one of them synchronous; all of it
    stopped and removed afterwards (``RADIX_HA_KEEP=1`` keeps the directory and its logs)."""
    timing = timing or Timing()
    bin_dir = pg_bin()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL 15 at /usr/lib/postgresql/15/bin: apt-get install postgresql-15")
    root = Path(tempfile.mkdtemp(prefix="radix-ha-", dir="/tmp"))
    os.chmod(root, 0o711)
    cluster = PatroniCluster(root, [], free_port())
    for role in (SUPERUSER, "radix_replicator", "radix_rewind"):
        cluster.passwords[role] = secrets.token_urlsafe(18)
    cluster.passfile.write_text(f"127.0.0.1:*:*:{SUPERUSER}:{cluster.passwords[SUPERUSER]}\n", encoding="utf-8")
    os.chmod(cluster.passfile, 0o600)
    logs: list[Any] = []
    etcd = None
    try:
        for index in range(1, members + 1):
            member = Member(f"m{index}", root / f"m{index}", free_port(), free_port())
            for directory in (member.root, member.root / "run"):
                directory.mkdir(mode=0o700)
                _own(directory)
            cluster.members.append(member)
        for member in cluster.members:
            member.config.write_text(json.dumps(_member_config(cluster, member, timing, bin_dir), indent=1),
                                     encoding="utf-8")
            os.chmod(member.config, 0o600)
            _own(member.config)
        etcd = _start_etcd(cluster, logs)
        _start_member(cluster, cluster.members[0], logs)  # the first one bootstraps, the others copy it
        wait_for(lambda: cluster.members[0].api("/primary")[0] == 200, 120, "the first member to lead", interval=0.2)
        for member in cluster.members[1:]:
            _start_member(cluster, member, logs)
        wait_for(cluster.healthy, 180, "every member streaming, one synchronous", interval=0.2)
        yield cluster
    finally:
        _stop(cluster, etcd)
        for log in logs:
            log.close()
        if os.environ.get("RADIX_HA_KEEP") != "1":
            shutil.rmtree(root, ignore_errors=True)
