"""A distribution PostgreSQL cluster with pg_cron preloaded, for ``bench/run.py compare``'s minute workloads.

Invariants: the cluster lives in a fresh directory under /tmp, opens only a Unix socket there (no TCP), lets
local logins in with ``trust`` (pg_cron's job sessions log in over libpq as the job's user), keeps the
distribution's default settings otherwise (``fsync`` on, 100 connections), and is stopped and removed when
the context ends. pg_cron keeps its tables in ``postgres`` (its default ``cron.database_name``) and runs
each job in the database named by ``cron.schedule_in_database``; its job sessions connect to the socket
(``cron.host``). Run as root, the server runs as the OS user ``postgres`` (PostgreSQL refuses root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

PORT = 5432
SUPERUSER = "postgres"
CRON_DATABASE = "postgres"


def pg_cron_bin() -> Path | None:
    """The bin directory of the newest distribution PostgreSQL that has pg_cron installed (Debian layout)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/lib/pg_cron.so"), key=lambda p: int(Path(p).parents[1].name))
    return Path(found[-1]).parents[1] / "bin" if found else None


def as_postgres() -> dict[str, Any]:
    """subprocess arguments that run a program as the OS user postgres when this process is root."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam("postgres")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, cwd="/", env={**os.environ, "LC_ALL": "C"},
                   **as_postgres())


@contextlib.contextmanager
def pg_cron_cluster(bin_dir: Path, settings: dict[str, str] | None = None) -> Iterator[str]:
    """Start the cluster (initdb, pg_cron preloaded, ``CREATE EXTENSION pg_cron`` in ``postgres``) and yield
    its superuser DSN; ``settings`` go to postgresql.conf after the pg_cron ones."""
    root = Path(tempfile.mkdtemp(prefix="radix-bench-pg-cron-", dir="/tmp"))
    os.chmod(root, 0o711)  # the server's OS user reaches its data and socket directories
    data, run = root / "data", root / "run"
    for directory in (data, run):
        directory.mkdir(mode=0o700)
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres", "postgres")
    conf = {"listen_addresses": "''", "port": str(PORT), "unix_socket_directories": f"'{run}'",
            "shared_preload_libraries": "'pg_cron'", "cron.database_name": f"'{CRON_DATABASE}'",
            "cron.host": f"'{run}'", "lc_messages": "'C'", **(settings or {})}
    started = False
    try:
        _run(str(bin_dir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth-local=trust",
             "--auth-host=reject", "-E", "UTF8", "--locale=C", "--no-instructions")
        with (data / "postgresql.conf").open("a", encoding="utf-8") as fh:
            fh.write("\n" + "".join(f"{name} = {value}\n" for name, value in conf.items()))
        _run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log"), "-w", "-t", "60", "start")
        started = True
        dsn = make_conninfo(host=str(run), port=PORT, user=SUPERUSER, dbname=CRON_DATABASE)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(b"CREATE EXTENSION pg_cron")
        yield dsn
    finally:
        if started:
            with contextlib.suppress(subprocess.CalledProcessError):
                _run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop")
        shutil.rmtree(root, ignore_errors=True)
