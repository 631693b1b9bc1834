"""An external PostgreSQL cluster from the distribution's packages, set up as docs/external.md says.

Invariants: the cluster lives in a fresh directory under /tmp (not pytest's basetemp), listens only on
127.0.0.1 on a free port and on its own socket directory, authenticates every TCP and local login with
scram-sha-256 (no trust, no peer), and is stopped and removed when the session ends. Run as root, the
server runs as the ``postgres`` OS user (PostgreSQL refuses root).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

SUPERUSER = "radix_admin"
SCHEDULER = "radix_scheduler"
DATABASE = "radix_ext"


def distribution_bin() -> Path | None:
    """The newest distribution PostgreSQL's bin directory (Debian layout), if any is installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam("postgres")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


@dataclass
class ExternalCluster:
    """A running cluster; ``passwords`` holds every role's password, ``passfile`` the principals' file."""

    root: Path
    bin: Path
    port: int
    passwords: dict[str, str] = field(default_factory=dict)

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def passfile(self) -> Path:
        return self.root / "pgpass"

    @property
    def version(self) -> int:
        return int(self.bin.parent.name)

    def dsn(self, user: str = SCHEDULER, dbname: str = DATABASE, *, password: bool = True) -> str:
        params: dict[str, Any] = {"host": "127.0.0.1", "port": self.port, "user": user, "dbname": dbname}
        if password:
            params["password"] = self.passwords[user]
        return make_conninfo(**params)

    def admin(self, dbname: str = DATABASE) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn(SUPERUSER, dbname), autocommit=True)

    def create_role(self, name: str, *, login: bool = True, in_passfile: bool = True) -> str:
        """A role with a scram password; listed in the password file when ``in_passfile``."""
        password = secrets.token_urlsafe(18)
        self.passwords[name] = password
        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE ROLE {} {} PASSWORD {}").format(
                sql.Identifier(name), sql.SQL("LOGIN" if login else "NOLOGIN"), sql.Literal(password)))
        if in_passfile:
            with self.passfile.open("a", encoding="utf-8") as fh:
                fh.write(f"127.0.0.1:{self.port}:*:{name}:{password}\n")
        return password

    def ctl(self, *args: str) -> None:
        subprocess.run([str(self.bin / "pg_ctl"), "-D", str(self.datadir), "-w", "-t", "60", *args], check=True,
                       capture_output=True, cwd="/", **_as_postgres())


def start_cluster(bin_dir: Path) -> ExternalCluster:
    """initdb (scram, no trust), configure, start, and create the superuser's, scheduler's database."""
    root = Path(tempfile.mkdtemp(prefix="radixjobs-external-", dir="/tmp"))
    cluster = ExternalCluster(root, bin_dir, _free_port())
    os.chmod(root, 0o711)  # the server's OS user reaches its data and socket directories
    data, run = cluster.datadir, root / "run"
    for directory in (data, run):
        directory.mkdir(mode=0o700)
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres", "postgres")
    superpass = secrets.token_urlsafe(18)
    cluster.passwords[SUPERUSER] = superpass
    pwfile = root / "superpass"
    pwfile.write_text(superpass + "\n", encoding="utf-8")
    os.chmod(pwfile, 0o644)
    subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", SUPERUSER, f"--pwfile={pwfile}",
                    "--auth=scram-sha-256", "-E", "UTF8", "--locale=C"], check=True, capture_output=True,
                   cwd="/", env={**os.environ, "LC_ALL": "C"}, **_as_postgres())
    pwfile.unlink()
    with (data / "postgresql.conf").open("a", encoding="utf-8") as fh:
        fh.write(f"\nlisten_addresses = '127.0.0.1'\nport = {cluster.port}\nunix_socket_directories = '{run}'\n"
                 "password_encryption = 'scram-sha-256'\nfsync = off\nmax_connections = 100\n")
    (data / "pg_hba.conf").write_text(
        "local all all scram-sha-256\nhost all all 127.0.0.1/32 scram-sha-256\n", encoding="utf-8")
    cluster.passfile.touch(mode=0o600)
    cluster.ctl("-l", str(data / "server.log"), "start")
    with psycopg.connect(cluster.dsn(SUPERUSER, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    return cluster


def setup_scheduler(cluster: ExternalCluster) -> None:
    """The scheduler role with exactly the grants docs/external.md lists."""
    cluster.create_role(SCHEDULER, in_passfile=False)
    with cluster.admin() as conn:
        for statement in (
            "GRANT pg_signal_backend, pg_read_all_stats TO {role}",
            "GRANT CREATE, CONNECT ON DATABASE {db} TO {role}",
        ):
            conn.execute(sql.SQL(statement).format(role=sql.Identifier(SCHEDULER), db=sql.Identifier(DATABASE)))


def stop_cluster(cluster: ExternalCluster) -> None:
    try:
        cluster.ctl("-m", "immediate", "stop")
    finally:
        shutil.rmtree(cluster.root, ignore_errors=True)


def external_cluster() -> Iterator[ExternalCluster]:
    """The session's cluster (the fixture's body); the caller skips when no distribution PostgreSQL."""
    bin_dir = distribution_bin()
    assert bin_dir is not None
    cluster = start_cluster(bin_dir)
    try:
        setup_scheduler(cluster)
        yield cluster
    finally:
        stop_cluster(cluster)


@dataclass
class ExternalDb:
    """A fresh database of the cluster the scheduler may install into (CREATE, CONNECT granted)."""

    cluster: ExternalCluster
    name: str

    def dsn(self, user: str = SCHEDULER, *, password: bool = True) -> str:
        return self.cluster.dsn(user, self.name, password=password)

    def admin(self) -> psycopg.Connection[Any]:
        return self.cluster.admin(self.name)

    def role(self, prefix: str, *, login: bool = True, in_passfile: bool = True) -> str:
        name = f"{prefix}_{secrets.token_hex(4)}"
        self.cluster.create_role(name, login=login, in_passfile=in_passfile)
        return name

    def env(self, **extra: str) -> dict[str, str]:
        """The daemon's environment: the principals' password file, and ``extra``."""
        return {"PGPASSFILE": str(self.cluster.passfile), **extra}


def new_database(cluster: ExternalCluster) -> ExternalDb:
    name = f"ext_{secrets.token_hex(6)}"
    with cluster.admin("postgres") as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("GRANT CREATE, CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(name), sql.Identifier(SCHEDULER)))
    return ExternalDb(cluster, name)


def drop_database(db: ExternalDb) -> None:
    with db.cluster.admin("postgres") as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(db.name)))
