"""The daemon's HTTP endpoint, /status and the embedded server's log against hostile local users.

- Idle and slowloris clients, more than the connection cap, against a daemon with a 256-descriptor limit:
  /healthz answers, the job keeps running, every such connection is closed after the request timeout.
- A job whose argument fails conversion: /status, `radixjobs status --json`, /metrics and the logs carry
  categories only; the history, read as the owner, has the text.
- As root: the embedded server's log is 0600, no parent directory's mode changes, and a failing statement's
  literal never reaches the log (nor can ``nobody`` read it).
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import resource
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from psycopg.conninfo import make_conninfo

from radixjobs import catalog
from radixjobs.cli import cli
from radixjobs.embedded import SERVER_OS_USER, EmbeddedServer
from radixjobs.server.http import BACKLOG
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.support import wait_for

NOFILE = 256
ATTACKERS = 300  # more than the cap, and more than the daemon's whole descriptor limit
REQUEST_TIMEOUT_S = 2.0
LISTEN = "0A"  # TCP state in /proc/net/tcp


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


class Flood:
    """Loopback connections that never finish a request: half send nothing, half a byte at a time."""

    def __init__(self, address: tuple[str, int], count: int):
        self.open: list[tuple[socket.socket, bool]] = []
        for i in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex(address)  # EINPROGRESS: the handshake completes on its own
            self.open.append((sock, i % 2 == 1))

    def trickle(self) -> int:
        """One more byte from each slow client; drop the connections the server closed. Returns the
        number still open."""
        still = []
        for sock, slow in self.open:
            if _closed_by_peer(sock) or (slow and not _send(sock, b"G")):
                sock.close()
            else:
                still.append((sock, slow))
        self.open = still
        return len(still)

    def close(self) -> None:
        for sock, _ in self.open:
            sock.close()


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.send(data)
    except BlockingIOError:
        return True  # still connecting, or the buffer is full: alive as far as we know
    except OSError:
        return False
    return True


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError as exc:
        return exc.errno != errno.ENOTCONN  # reset or refused: closed; still connecting: not yet


def _healthz(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _http_connections(pid: int, port: int) -> int:
    """TCP connections the daemon holds open on its HTTP port (its descriptors, matched by socket inode)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open(f"/proc/{pid}/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if int(row[1].rpartition(":")[2], 16) == port and row[3] != LISTEN
               and row[9] in inodes)


def _effects(app: App) -> int:
    row = app.conn.execute("SELECT count(*) FROM app.effects").fetchone()
    return int(row[0]) if row else 0


def test_idle_and_slowloris_clients_cannot_starve_the_daemon(app: App, tmp_path: Path) -> None:
    app.job("CREATE JOB app.beat SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('beat')")
    daemon = Serve(tmp_path, "--http-request-timeout", str(REQUEST_TIMEOUT_S), "--concurrency", "4",
                   "--per-database-concurrency", "4", "--poll", "0.2", env={"RADIXJOBS_DSN": app.dsn},
                   preexec_fn=_low_nofile)
    address = urlsplit(daemon.url)
    assert address.hostname == "127.0.0.1"
    assert address.port
    flood = None
    try:
        wait_for(lambda: _effects(app) >= 2, timeout=60, message="the job to run")
        cap = next(line["http_max_connections"] for line in daemon.log_lines() if "http_max_connections" in line)
        assert 1 <= cap <= NOFILE // 2
        flood = Flood(("127.0.0.1", address.port), ATTACKERS)
        peak, peak_http = 0, 0

        def healthy_under_attack() -> bool:
            nonlocal peak, peak_http
            assert flood is not None
            flood.trickle()
            peak = max(peak, _descriptors(daemon.proc.pid))
            peak_http = max(peak_http, _http_connections(daemon.proc.pid, address.port))
            return _healthz(daemon.url)

        wait_for(healthy_under_attack, timeout=120, interval=0.2, message="/healthz to answer during the flood")
        before = _effects(app)
        # every attacker is disconnected (refused over the cap, or past the request timeout) while the
        # clients still hold their ends and the slow ones keep sending: the daemon is back to its baseline
        wait_for(lambda: healthy_under_attack() and _http_connections(daemon.proc.pid, address.port) == 0,
                 timeout=120, interval=0.2, message="every idle and slow client closed")
        assert peak < NOFILE - 32, peak  # the scheduler's reserve was never touched
        # the flood filled the cap, and no more than the sockets in flight: asyncio accepts up to BACKLOG at
        # once and closes a refused (aborted) one on its next loop iteration, so one accepted batch and the
        # refused one before it can be open together (measured up to cap + 86 with cap + BACKLOG = 128)
        assert cap // 2 <= peak_http <= cap + 2 * BACKLOG, (peak_http, cap)
        wait_for(lambda: _effects(app) >= before + 2, timeout=60, message="the job to keep running")
        status = daemon.status()
        assert status["counters"]["failures_connection"] == 0, status
        failures = app.conn.execute("SELECT count(*) FROM radix.radix_system_job_history "
                                    "WHERE status <> 'succeeded'").fetchone()
        assert failures == (0,)
        _assert_closed_after_timeout(("127.0.0.1", address.port), slow=False)
        _assert_closed_after_timeout(("127.0.0.1", address.port), slow=True)
        assert _healthz(daemon.url)
    finally:
        if flood is not None:
            flood.close()
        daemon.stop()


def _assert_closed_after_timeout(address: tuple[str, int], *, slow: bool) -> None:
    """A client that sends nothing (or a header byte every 0.2 s) is cut off after the request timeout:
    not before half of it, and at all (within a minute, however loaded the machine)."""
    with socket.create_connection(address, timeout=5) as sock:
        started = time.monotonic()
        sock.settimeout(0.2)
        if slow:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        closed = False
        while not closed and time.monotonic() - started < 60:
            try:
                closed = sock.recv(1) == b""
            except TimeoutError:
                closed = slow and not _send(sock, b"X")
            except ConnectionResetError:
                closed = True
        elapsed = time.monotonic() - started
    assert closed, elapsed
    assert elapsed >= REQUEST_TIMEOUT_S * 0.5, elapsed


def test_status_publishes_categories_not_error_texts(app: App, roles: Any, tmp_path: Path) -> None:
    secret = f"card-{uuid.uuid4().hex[:12]}"
    app.conn.execute("CREATE PROCEDURE app.charge(card text) LANGUAGE plpgsql AS $$ BEGIN "
                     "PERFORM card::bigint; END $$")
    app.conn.execute(sql.SQL("GRANT CREATE ON SCHEMA app TO {}").format(sql.Identifier(app.principal)))
    as_owner = make_conninfo(app.dsn, user=app.principal)
    with psycopg.connect(as_owner, autocommit=True) as owner:
        catalog.execute_job_ddl(owner, f"CREATE JOB app.charge SCHEDULE EVERY INTERVAL '1 second' "
                                       f"RUN AS {app.principal} CALL app.charge('{secret}')")
    daemon = Serve(tmp_path, env={"RADIXJOBS_DSN": app.dsn})
    try:
        wait_for(lambda: daemon.status()["counters"]["failures_data"] >= 1, timeout=60, message="a failure")
        status_text = daemon.get("/status")[1]
        metrics = daemon.get("/metrics")[1]
        http = urlsplit(daemon.url).netloc
        cli_json = CliRunner().invoke(cli, ["status", "--http", http, "--json"], env={"RADIXJOBS_DSN": app.dsn})
        assert cli_json.exit_code == 0, cli_json.output
        logs = daemon.log.read_text()
    finally:
        daemon.stop()
    status = json.loads(status_text)
    assert status["last_error"] == {"source": "job", "category": "data", "kind": "invalid_text_representation"}
    assert json.loads(cli_json.output)["last_error"] == status["last_error"]
    for where, text in {"status": status_text, "cli": cli_json.output, "metrics": metrics, "logs": logs}.items():
        assert secret[5:] not in text, where  # the value, with or without its prefix
        assert "invalid input syntax" not in text, where
    # the text stays where PostgreSQL's row visibility applies: the owner reads it, another role does not
    with psycopg.connect(as_owner, autocommit=True) as owner:
        errors = owner.execute("SELECT error->>'message' FROM radix.job_history WHERE error IS NOT NULL").fetchall()
    assert errors
    assert all(secret in row[0] for row in errors)
    stranger = roles("stranger")
    with psycopg.connect(make_conninfo(app.dsn, user=stranger), autocommit=True) as other:
        assert other.execute("SELECT count(*) FROM radix.job_history").fetchone() == (0,)


@pytest.mark.skipif(os.geteuid() != 0, reason="the embedded server changes OS users only when run as root")
def test_embedded_server_log_is_private_and_parents_keep_their_modes(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    home = private / "home"
    modes = {path: stat.S_IMODE(path.stat().st_mode) for path in (private, *private.parents)}
    server = EmbeddedServer(home, settings={"fsync": "off"})
    info, _ = server.ensure_running(persistent=True)
    try:
        assert {path: stat.S_IMODE(path.stat().st_mode) for path in modes} == modes
        log = server.log_file
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert log.stat().st_uid == pwd.getpwnam(SERVER_OS_USER).pw_uid
        secret = f"secret-{uuid.uuid4().hex[:12]}"
        with psycopg.connect(info.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(f"principal_{secret[7:]}")))
        with psycopg.connect(info.dsn(user=f"principal_{secret[7:]}"), autocommit=True) as conn:
            for statement, params in ((f"SELECT '{secret}-literal'::bigint", None),
                                      ("SELECT %s::bigint", (f"{secret}-bound",))):
                with pytest.raises(psycopg.errors.InvalidTextRepresentation):
                    conn.execute(statement, params)  # type: ignore[arg-type]
        text = log.read_text()
        assert "ready to accept connections" in text  # the log works; it just holds no statement data
        assert secret not in text
        unreadable = subprocess.run(["cat", str(log)], user="nobody", capture_output=True, check=False)
        assert unreadable.returncode != 0
        assert secret.encode() not in unreadable.stdout
    finally:
        server.release()
        server.destroy()
    assert not server.server_dir.exists()
