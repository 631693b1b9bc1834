"""What a running daemon shows: security failures redacted in all four places they surface (history, JSON
logs, /status, /metrics — and a document's ERROR_TEXT), no job arguments, and HTTP on loopback by default.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from psycopg import sql

from radixjobs import documents
from radixjobs.cli import cli
from radixjobs.server.http import DEFAULT_HTTP
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.support import wait_for

LOOPBACK_LISTEN = "0100007F"  # 127.0.0.1 in /proc/net/tcp


class Secrets:
    """Objects whose names a security failure would reveal, unredacted."""

    def __init__(self, app: App, roles: Any):
        tag = uuid.uuid4().hex[:8]
        self.table, self.procedure = f"payroll_{tag}", f"raise_salary_{tag}"
        self.role, self.argument = roles(f"board_{tag}", "NOLOGIN"), f"argument-secret-{tag}"
        self.names = [self.table, self.procedure, self.role, self.argument, app.principal]
        ident = sql.Identifier
        for statement in (
            sql.SQL("CREATE TABLE app.{} (salary int)").format(ident(self.table)),
            sql.SQL("CREATE PROCEDURE app.{}() LANGUAGE sql BEGIN ATOMIC SELECT 1; END").format(ident(self.procedure)),
            sql.SQL("REVOKE EXECUTE ON PROCEDURE app.{}() FROM PUBLIC").format(ident(self.procedure)),
        ):
            app.conn.execute(statement)
        self._job(app, "reads", sql.SQL("PERFORM count(*) FROM app.{};").format(ident(self.table)))
        self._job(app, "calls", sql.SQL("CALL app.{}();").format(ident(self.procedure)))
        self._job(app, "becomes", sql.SQL("SET ROLE {};").format(ident(self.role)))
        app.conn.execute(sql.SQL("CREATE FUNCTION app.doc_reads() RETURNS void LANGUAGE plpgsql AS $$ BEGIN "
                                 "PERFORM count(*) FROM app.{}; END $$").format(ident(self.table)))
        documents.apply(app.conn, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
            "NUM": 1, "DB_FUNCTION": "app.doc_reads", "RUN_AS": app.principal,
            "INTERVAL": "now() + interval '1 hour'"}})

    def _job(self, app: App, name: str, body: sql.Composable) -> None:
        app.conn.execute(sql.SQL("CREATE PROCEDURE app.{}(note text) LANGUAGE plpgsql AS $$ BEGIN {} END $$")
                         .format(sql.Identifier(f"task_{name}"), body))
        app.job(f"CREATE JOB app.{name} SCHEDULE EVERY INTERVAL '1 second' RUN AS {{p}} "
                f"CALL app.task_{name}('{self.argument}')")

    def found_in(self, text: str) -> list[str]:
        return [name for name in self.names if name in text]


def test_security_failures_are_redacted_everywhere(app: App, roles: Any, tmp_path: Path) -> None:
    secrets = Secrets(app, roles)
    daemon = Serve(tmp_path, env={"RADIXJOBS_DSN": app.dsn}, name="node")
    try:
        wait_for(lambda: daemon.status()["counters"]["failures_security"] >= 6
                 and daemon.status()["counters"]["doc_failures"] >= 1, timeout=60, message="security failures")
        status_text, metrics = json.dumps(daemon.status()), daemon.get("/metrics")[1]
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
    finally:
        daemon.stop()
    history = app.conn.execute("SELECT error FROM radix.radix_system_job_history WHERE error IS NOT NULL").fetchall()
    assert {row[0]["category"] for row in history} == {"security"}
    assert {row[0]["message"] for row in history} <= {"permission denied (redacted)"}, history
    doc = documents.get_document(app.conn, 1)
    assert doc is not None
    assert doc["props"]["ERROR_TEXT"] == "[42501] permission denied (redacted)"
    processes = app.conn.execute("SELECT error_text FROM radix.sys_processes").fetchall()
    logs = daemon.log.read_text()
    assert re.search(r'"outcome": "failed:security"', logs)
    places = {"history": json.dumps([row[0] for row in history]),
              "documents": json.dumps([doc["props"]["ERROR_TEXT"], processes]),
              "logs": logs, "status": status_text, "metrics": metrics}
    assert {where: secrets.found_in(text) for where, text in places.items()} == {key: [] for key in places}
    assert json.loads(status_text)["last_error"] is not None


def test_the_status_endpoint_binds_loopback_by_default(app: App, tmp_path: Path) -> None:
    option = next(p for p in cli.commands["serve"].params if p.name == "http")
    assert option.default == DEFAULT_HTTP == "127.0.0.1:7317"
    assert "[default: 127.0.0.1:7317]" in CliRunner().invoke(cli, ["serve", "--help"]).output
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 7317)) == 0:
            pytest.skip("something already listens on 127.0.0.1:7317")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"RADIXJOBS_DSN": app.dsn}
    log = tmp_path / "default.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "radixjobs", "serve", "--node-id", "default"],
                                stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        wait_for(lambda: "status: http://" in log.read_text() or proc.poll() is not None, timeout=60,
                 message="the daemon to serve")
        assert "status: http://127.0.0.1:7317/status" in log.read_text()
        listening = _listening_on(7317)
        assert listening == {LOOPBACK_LISTEN}, listening  # 127.0.0.1 only, never 0.0.0.0 (00000000)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _listening_on(port: int) -> set[str]:
    """Addresses with a TCP socket in LISTEN state on ``port`` (IPv4 and IPv6 tables)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                address, _, hex_port = fields[1].partition(":")
                if int(hex_port, 16) == port and fields[3] == "0A":
                    found.add(address)
    return found
