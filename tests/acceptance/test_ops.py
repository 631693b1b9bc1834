"""Operating radixjobs (issue #16, items 3, 4 and 6): PostgreSQL down at start, the config file, SIGHUP, the
systemd unit, the wheel, and CSP workers that never outlive their scheduler."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from radixjobs import documents, migrate
from radixjobs.embedded import EmbeddedServer
from tests.acceptance.conftest import run_cli
from tests.acceptance.serving import Serve
from tests.apps import App, make_app
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
SLEEPER = "sleeper=tests.acceptance.ops_services:sleeper"
MARKER = "marker=tests.acceptance.ops_services:marker"


def healthz(daemon: Serve) -> tuple[int, str]:
    try:
        return daemon.get("/healthz")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def events(daemon: Serve, name: str) -> list[dict[str, Any]]:
    return [line for line in daemon.log_lines() if line.get("event") == name]


def alive(pid: int) -> bool:
    """Is the process running (a zombie left to a parent that does not reap is not)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def csp_document(app: App, num: int, service: str, params: dict[str, Any]) -> None:
    with psycopg.connect(app.dsn, user=app.principal, autocommit=True) as as_principal:
        documents.apply(as_principal, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
            "NUM": num, "CSP_SERVICE": service, "CSP_SERVICE_PARAMS": params,
            "INTERVAL": "NOW() + INTERVAL '1 hour'"}})


# -- item 3: PostgreSQL down at start ------------------------------------------------------------------
def test_serve_waits_for_postgresql_that_is_down_at_start(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "external")
    info, _ = server.ensure_running(persistent=True)
    server.release()  # persistent: it keeps running until stopped
    try:
        dsn = info.dsn()
        with psycopg.connect(dsn, autocommit=True) as su:
            migrate.install(su)
            su.execute("CREATE ROLE ops_worker LOGIN")
            make_app(dsn, su, "ops_worker")
            su.execute("SELECT radix.create_job('app.tick', jsonb_build_object('every', '1 second'), 'ops_worker', "
                       "'app.record', jsonb_build_array(jsonb_build_object('kind', 'string', 'value', 'tick')))")
        server.stop()
        daemon = Serve(tmp_path, "--dsn", dsn, "--discovery-interval", "1")
        try:
            wait_for(lambda: events(daemon, "postgres_unreachable"), timeout=60, message="the unreachable line")
            assert healthz(daemon) == (503, "not ready: PostgreSQL is not reachable")
            time.sleep(3)  # several retries (0.2 s doubling up to 1 s); the assertion is on the log below
            assert daemon.proc.poll() is None
            assert len(events(daemon, "postgres_unreachable")) == 1
            server.ensure_running(persistent=True)
            server.release()
            wait_for(lambda: healthz(daemon) == (200, "ok"), timeout=60, message="ready once PostgreSQL runs")
            with psycopg.connect(dsn, autocommit=True) as su:
                wait_for(lambda: su.execute("SELECT count(*) FROM app.effects").fetchone() != (0,), timeout=60,
                         message="a job run without a restart")
            assert len(events(daemon, "postgres_unreachable")) == 1
            assert len(events(daemon, "postgres_reachable")) == 1
            daemon.signal(signal.SIGTERM)
            assert daemon.wait() == 0
        finally:
            daemon.stop()
    finally:
        server.destroy()


# -- item 4: the config file, SIGHUP ---------------------------------------------------------------------
def test_serve_takes_its_settings_from_a_config_file(app: App, tmp_path: Path) -> None:
    app.job("CREATE JOB app.tick SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('tick')")
    config = tmp_path / "radixjobs.toml"
    # the file wins over the environment (a DSN nobody listens at) and gives way to the command line (node-id)
    config.write_text(f'dsn = [{json.dumps(app.dsn)}]\nnode-id = "from-file"\npoll = 0.5\n', encoding="utf-8")
    daemon = Serve(tmp_path, "--config", str(config), env={"RADIXJOBS_DSN": "host=/nonexistent dbname=nothing"})
    try:
        wait_for(lambda: daemon.status()["counters"]["successes"] >= 1, timeout=60, message="a job run")
        assert daemon.status()["node"] == "node"
        assert healthz(daemon) == (200, "ok")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
    finally:
        daemon.stop()


def test_a_bad_config_file_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "radixjobs.toml"
    config.write_text("concurrency = 0\n", encoding="utf-8")
    result = run_cli("serve", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"Error: config file {config}, line 1: key 'concurrency': 0 is not in the range 1<=x<=1024."]
    config.write_text("concurrency = \n", encoding="utf-8")
    result = run_cli("serve", "--config", str(config))
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1
    assert "invalid TOML" in result.stderr


def test_sighup_reloads_the_file_and_the_services_without_dropping_running_work(
        app: App, tmp_path: Path) -> None:
    for service in ("sleeper", "marker"):
        app.conn.execute("SELECT radix.grant_service(%s, %s)", (service, app.principal))
    pid_file, done_file, marked = tmp_path / "sleeper.pid", tmp_path / "sleeper.done", tmp_path / "marker"
    csp_document(app, 1, "sleeper", {"pid_file": str(pid_file), "done_file": str(done_file), "seconds": 8})
    config = tmp_path / "radixjobs.toml"
    base = f"dsn = {json.dumps(app.dsn)}\n"
    config.write_text(base + f'service = ["{SLEEPER}"]\n', encoding="utf-8")
    daemon = Serve(tmp_path, "--config", str(config))
    try:
        wait_for(pid_file.exists, timeout=60, message="the sleeper running")
        config.write_text(base + f'service = ["{SLEEPER}", "{MARKER}"]\npoll = 0.5\nconcurrency = 64\n',
                          encoding="utf-8")
        daemon.signal(signal.SIGHUP)
        reloaded = wait_for(lambda: events(daemon, "reloaded"), timeout=60, message="the reload")[0]
        assert reloaded["applied"] == ["poll", "service"]
        assert reloaded["needs_restart"] == ["concurrency"]
        assert reloaded["services"] == ["added marker"]
        assert not done_file.exists()  # the running call is still running
        csp_document(app, 2, "marker", {"path": str(marked)})
        wait_for(marked.exists, timeout=60, message="the service registered by the reload to run")
        wait_for(lambda: daemon.status()["counters"]["doc_successes"] >= 2, timeout=60, message="both runs")
        assert done_file.read_text() == "done"
        assert daemon.status()["counters"]["doc_failures"] == 0
        # a configuration with a problem changes nothing
        config.write_text(base + "poll = 'soon'\n", encoding="utf-8")
        daemon.signal(signal.SIGHUP)
        failed = wait_for(lambda: events(daemon, "reload_failed"), timeout=60, message="the failed reload")[0]
        assert "key 'poll': expected a number, got a string" in failed["message"]
        assert healthz(daemon) == (200, "ok")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
    finally:
        daemon.stop()


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    text = (ROOT / "contrib" / "radixjobs.service").read_text(encoding="utf-8")
    for option in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                   "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "User=radixjobs",
                   "ExecReload=/bin/kill -HUP $MAINPID"):
        assert option in text.splitlines()
    unit = tmp_path / "radixjobs.service"  # ExecStart must name an executable that exists here
    unit.write_text(text.replace("/usr/local/bin/radixjobs", str(Path(sys.executable).parent / "radixjobs")),
                    encoding="utf-8")
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert str(unit) not in result.stdout + result.stderr  # unknown keys and bad values are only warnings


@pytest.mark.slow
def test_the_wheel_installs_and_ships_its_files(tmp_path: Path) -> None:
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                   check=True, capture_output=True, timeout=180)
    (wheel,) = wheels.glob("radixjobs-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "src" / "radixjobs"
    data = {f"radixjobs/{p.relative_to(package).as_posix()}" for p in package.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert "radixjobs/sql/routines/grants.sql" in data
    assert data <= names
    licenses = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert len(licenses) == 1
    assert zipfile.ZipFile(wheel).read(licenses[0]) == (ROOT / "LICENSE").read_bytes()
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=180)
    env = {**os.environ, "PYTHONPATH": str(target)}
    check = subprocess.run([sys.executable, "-c", "import radixjobs, radixjobs.migrate as m; "
                            "print(radixjobs.__file__); print(m.code_version()); "
                            "print(len(m.read_sql('routines/grants.sql')))"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert check.returncode == 0, check.stderr
    path, version, size = check.stdout.split()
    assert path.startswith(str(target))
    assert int(version) == migrate.code_version()
    assert int(size) > 1000
    helped = subprocess.run([sys.executable, "-m", "radixjobs", "--help"], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "serve" in helped.stdout


# -- item 6: CSP workers die with their scheduler -----------------------------------------------------------
def test_a_csp_worker_does_not_outlive_its_scheduler(app: App, tmp_path: Path) -> None:
    app.conn.execute("SELECT radix.grant_service('sleeper', %s)", (app.principal,))
    pid_file, done_file = tmp_path / "sleeper.pid", tmp_path / "sleeper.done"
    csp_document(app, 1, "sleeper", {"pid_file": str(pid_file), "done_file": str(done_file), "seconds": 120})
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    scheduler = subprocess.Popen([sys.executable, "-m", "radixjobs", "docs", "run", "--for", "600", "--service",
                                  SLEEPER], env={**env, "RADIXJOBS_DSN": app.dsn}, cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=60, message="the worker running")
        worker = int(pid_file.read_text())
        assert alive(worker)
        scheduler.kill()
        scheduler.wait(10)
        wait_for(lambda: not alive(worker), timeout=60, message="the worker to die with its scheduler")
    finally:
        scheduler.kill()
        scheduler.wait(10)
        if pid_file.exists() and pid_file.read_text() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert not done_file.exists()
