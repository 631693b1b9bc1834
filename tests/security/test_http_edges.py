"""The daemon's HTTP port at its edges: the Host it answers to, the size of a request head, a busy port.

- DNS rebinding: a request naming a Host other than the allowed ones (a name of the attacker's, with or
  without a port, none, two) gets 421 on every path, the anonymous ones included, and none of their data;
  the bound address and localhost are answered, with a port, in brackets for IPv6.
- ``--http-allowed-hosts`` replaces the default, from the flag, the environment or the config file, with the
  flag winning over the file and the file over the environment; a bad entry is one line, exit 2.
- A request head over 8 KiB gets 431, whether it arrives at once, in pieces or pipelined after another request.
- ``serve`` on a port in use: one line naming the address and the port, non-zero exit, nothing started.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from radixjobs.server.connections import MAX_HEADER_BYTES
from tests.acceptance.serving import Serve
from tests.apps import App

PATHS = ["/status", "/metrics", "/healthz", "/", "/jobs", "/login", "/static/console.css"]
HOSTILE = ["rebind.attacker.example", "rebind.attacker.example:{port}", "127.0.0.1.attacker.example:{port}",
           "localhost.attacker.example", "[::1]:{port}", "127.0.0.1:notaport", "::1", "", "*"]


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port
    return port


def _get(url: str, path: str, host: str | None) -> tuple[int, bytes]:
    """GET ``path`` with ``Host: host`` (None: no Host at all, as HTTP/1.0 allows)."""
    parts = urlsplit(url)
    address = (parts.hostname or "", _port(url))
    if host is None:
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            answer = _read_all(sock)
        return int(answer.split(b" ", 2)[1]), answer
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _read_all(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def _daemon(app: App, tmp_path: Path, *args: str, env: dict[str, str] | None = None, name: str = "edges") -> Serve:
    return Serve(tmp_path, *args, env={"RADIXJOBS_DSN": app.dsn, **(env or {})}, name=name)


def test_dns_rebinding_gets_421_everywhere(app: App, tmp_path: Path) -> None:
    daemon = _daemon(app, tmp_path)
    try:
        port = _port(daemon.url)
        for path in PATHS:
            for host in HOSTILE:
                status, body = _get(daemon.url, path, host.format(port=port))
                assert status == 421, (path, host, status)
                assert b"node" not in body
                assert b"radixjobs_" not in body
            assert _get(daemon.url, path, None)[0] == 421
            for host in ("127.0.0.1:{port}", "127.0.0.1", "localhost:{port}", "LOCALHOST.:{port}"):
                status, _ = _get(daemon.url, path, host.format(port=port))
                assert status in (200, 303, 401), (path, host, status)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:  # two Host headers
            sock.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: rebind.attacker.example\r\n"
                         b"Connection: close\r\n\r\n")
            assert _read_all(sock).split(b" ")[1] in (b"400", b"421")  # h11 refuses it first
        assert daemon.status()["node"] == "edges"  # the helper's own requests name 127.0.0.1:port
    finally:
        daemon.stop()


def test_ipv6_host_with_brackets_and_port(app: App, tmp_path: Path) -> None:
    daemon = _daemon(app, tmp_path, "--http", "[::1]:0")
    try:
        assert urlsplit(daemon.url).hostname == "::1"
        port = _port(daemon.url)
        for host in ("[::1]:{port}", "[::1]", "[0:0::1]:{port}", "localhost:{port}"):
            assert _get(daemon.url, "/status", host.format(port=port))[0] == 200, host
        for host in ("::1", "[::1", "[::1]x", "127.0.0.1:{port}", "[::2]:{port}", "rebind.attacker.example"):
            assert _get(daemon.url, "/status", host.format(port=port))[0] == 421, host
    finally:
        daemon.stop()


def test_allowed_hosts_from_the_flag_the_environment_and_the_config_file(app: App, tmp_path: Path) -> None:
    env = {"RADIXJOBS_HTTP_ALLOWED_HOSTS": "sched.example.com, 127.0.0.1"}
    config = tmp_path / "radixjobs.toml"
    config.write_text('http-allowed-hosts = ["cfg.example", "127.0.0.1"]\n', encoding="utf-8")
    cases = [((), {"sched.example.com", "SCHED.example.com."}, {"localhost", "cfg.example"}),
             (("--http-allowed-hosts", "other.example,127.0.0.1"), {"other.example"},
              {"sched.example.com", "localhost"}),
             (("--config", str(config)), {"cfg.example"}, {"sched.example.com", "localhost"}),
             (("--config", str(config), "--http-allowed-hosts", "127.0.0.1", "--http-allowed-hosts", "x.example"),
              {"x.example"}, {"cfg.example", "sched.example.com"})]
    for i, (args, answered, refused) in enumerate(cases):
        daemon = _daemon(app, tmp_path, *args, env=env, name=f"hosts{i}")
        try:
            port = _port(daemon.url)
            for host in answered:
                assert _get(daemon.url, "/status", f"{host}:{port}")[0] == 200, (args, host)
            for host in refused:
                assert _get(daemon.url, "/status", f"{host}:{port}")[0] == 421, (args, host)
        finally:
            daemon.stop()
    for bad in ("evil.example:80", "*.example.com", "http://x", " , "):
        proc = subprocess.run([sys.executable, "-m", "radixjobs", "serve", "--http-allowed-hosts", bad],
                              env=_env(app), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (bad, proc.stderr)
        assert "--http-allowed-hosts" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("delivery", ["at once", "in pieces", "pipelined"])
def test_a_request_head_over_8_kib_gets_431(app: App, tmp_path: Path, delivery: str) -> None:
    daemon = _daemon(app, tmp_path, name=f"head-{delivery.replace(' ', '-')}")
    try:
        address = ("127.0.0.1", _port(daemon.url))

        def head(padding: int) -> bytes:
            return (f"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: {'a' * padding}\r\n"
                    f"Connection: close\r\n\r\n").encode()

        for padding, expected in ((MAX_HEADER_BYTES - 200, b"200"), (64 * 1024, b"431"),
                                  (MAX_HEADER_BYTES + 10, b"431")):
            with socket.create_connection(address, timeout=10) as sock:
                request = head(padding)
                if delivery == "pipelined":
                    sock.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + request)
                elif delivery == "in pieces":
                    for start in range(0, len(request), 1024):
                        if not _sent(sock, request[start:start + 1024]):
                            break  # the server answered and closed before the rest
                        time.sleep(0.01)  # pieces, not a synchronisation
                else:
                    sock.sendall(request)
                answer = _read_all(sock)
            statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
            assert statuses == [b"200", expected] if delivery == "pipelined" else [expected], (delivery, padding,
                                                                                              statuses)
            assert expected == b"200" or b'"node"' not in answer.rpartition(b"HTTP/1.1 ")[2]  # no status
    finally:
        daemon.stop()


def _sent(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def _env(app: App, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "RADIXJOBS_"))}
    return {**base, "RADIXJOBS_DSN": app.dsn, **extra}


def test_serve_on_a_busy_port_says_so_in_one_line(app: App, tmp_path: Path) -> None:
    """The second ``make run``: another daemon holds the port. Nothing starts, not even the embedded server."""
    first = _daemon(app, tmp_path, name="first")
    try:
        port = _port(first.url)
        home = tmp_path / "home"
        for env in (_env(app), {k: v for k, v in _env(app, RADIXJOBS_HOME=str(home)).items()
                                if k != "RADIXJOBS_DSN"}):
            proc = subprocess.run([sys.executable, "-m", "radixjobs", "serve", "--http", f"127.0.0.1:{port}"],
                                  env=env, capture_output=True, text=True, timeout=120)
            assert proc.returncode != 0
            assert proc.stderr.splitlines() == [
                f"radixjobs: error: cannot listen on 127.0.0.1:{port} (--http): the address is already in use "
                "(another radixjobs serve?)"], proc.stderr
            assert not home.exists()  # checked before the embedded server would start
        assert first.status()["node"] == "first"
    finally:
        first.stop()
