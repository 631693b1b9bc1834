"""docs/external.md's "Everything in one script", run as written on a fresh distribution PostgreSQL cluster.

Only the four variables at the script's top are changed (the cluster's port and socket directory, its
superuser, the daemon's status address, all on loopback). The superuser's password is in ``~/.pgpass`` (a
private HOME), as the doc says; ``radixjobs`` on the PATH runs this checkout. The daemon the script ends with
is asked for a run of the job, which must run as its principal; then it is stopped.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.conftest import run_cli
from tests.external import SUPERUSER, ExternalCluster, distribution_bin, start_cluster, stop_cluster
from tests.support import wait_for

DOC = Path(__file__).resolve().parents[2] / "docs" / "external.md"
MARKER = "<!-- tests/acceptance/test_external_script.py runs the next block as written -->"


def doc_script() -> str:
    """The ``sh`` block right after the marker in docs/external.md."""
    text = DOC.read_text(encoding="utf-8")
    assert text.count(MARKER) == 1, "the marker of the tested script is missing from docs/external.md"
    found = re.match(r"\s*```sh\n(.*?)\n```", text.split(MARKER, 1)[1], re.DOTALL)
    assert found is not None, "no ```sh block right after the marker"
    return found.group(1) + "\n"


def with_variables(script: str, values: dict[str, str]) -> str:
    """The script with the values of its top variables replaced (each assigned once, at the start of a line)."""
    for name, value in values.items():
        script, count = re.subn(rf"^{name}=\S+", f"{name}={value}", script, flags=re.MULTILINE)
        assert count == 1, f"the script assigns {name} {count} times"
    return script


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def fresh_cluster() -> Iterator[ExternalCluster]:
    """A cluster of its own: the script creates cluster-wide roles (radix_scheduler) the shared one has."""
    bin_dir = distribution_bin()
    if bin_dir is None:
        if os.environ.get("RADIXJOBS_REQUIRE_EXTERNAL_PG") or os.environ.get("CI"):
            pytest.fail("no distribution PostgreSQL (/usr/lib/postgresql/*/bin/initdb): .ci/run installs it")
        pytest.skip("no distribution PostgreSQL installed: apt-get install postgresql")
    cluster = start_cluster(bin_dir)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def _environment(home: Path) -> dict[str, str]:
    """A private HOME and a ``radixjobs`` first on the PATH that runs this interpreter and checkout."""
    bin_dir = home / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "radixjobs"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m radixjobs "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "RADIXJOBS_"))}
    return {**base, "HOME": str(home), "PATH": f"{bin_dir}:{base.get('PATH', '/usr/bin:/bin')}"}


def _read_output(process: subprocess.Popen[str], lines: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)


def test_the_documented_script_sets_up_a_cluster_and_its_job_runs(fresh_cluster: ExternalCluster,
                                                                 tmp_path: Path) -> None:
    cluster = fresh_cluster
    socket_dir = cluster.root / "run"
    status_port = _free_port()
    home = tmp_path / "home"
    home.mkdir()
    passfile = home / ".pgpass"
    passfile.write_text(f"{socket_dir}:{cluster.port}:*:{SUPERUSER}:{cluster.passwords[SUPERUSER]}\n",
                        encoding="utf-8")
    passfile.chmod(0o600)
    script = tmp_path / "setup.sh"
    script.write_text(with_variables(doc_script(), {
        "PORT": str(cluster.port), "SOCKET_DIR": str(socket_dir), "SUPERUSER": SUPERUSER,
        "STATUS_ADDRESS": f"127.0.0.1:{status_port}"}), encoding="utf-8")
    env = _environment(home)
    lines: list[str] = []
    with subprocess.Popen(["sh", str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as process:
        reader = threading.Thread(target=_read_output, args=(process, lines), daemon=True)
        reader.start()
        try:
            _check_the_setup(cluster, process, lines, home, socket_dir)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
            reader.join(timeout=10)


def _check_the_setup(cluster: ExternalCluster, process: subprocess.Popen[str], lines: list[str], home: Path,
                     socket_dir: Path) -> None:
    wait_for(lambda: process.poll() is not None or any("radixjobs serving" in line for line in lines),
             timeout=180)
    assert process.poll() is None, f"the script ended ({process.returncode}): {''.join(lines)}"
    admin = f"host={socket_dir} port={cluster.port} dbname=app user={SUPERUSER}"
    ran = run_cli("jobs", "run", "app.nightly", "--wait", "--wait-timeout", "120", "--json", "--dsn", admin,
                  env={"HOME": str(home)})
    assert ran.returncode == 0, ran.stdout + ran.stderr + "".join(lines)
    with psycopg.connect(f"{admin} password={cluster.passwords[SUPERUSER]}") as conn:
        assert conn.execute("SELECT ran_as FROM app.nightly_runs").fetchall() == [("maintenance_worker",)]
        owner = conn.execute("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'radix'")
        assert owner.fetchone() == ("radix_scheduler",)
        scram: Any = conn.execute("SELECT count(*) FROM pg_authid WHERE rolname IN ('radix_scheduler', "
                                  "'maintenance_worker') AND rolpassword LIKE 'SCRAM-SHA-256$%'").fetchone()
        assert scram == (2,)
    passfile = home / ".pgpass"
    assert passfile.stat().st_mode & 0o777 == 0o600
    assert passfile.read_text(encoding="utf-8").count(f"127.0.0.1:{cluster.port}:app:") == 2
    assert "all 1 principal(s) can log in" in "".join(lines)
