"""A daemon with its console for the console tests: token, jobs that succeed, fail and take time."""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from radixjobs.documents import store
from tests.acceptance.serving import Serve
from tests.apps import App

TOKEN = "console-test-token-0123456789"
CHROMIUM = os.environ.get("RADIXJOBS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

CONSOLE_SQL = """
CREATE PROCEDURE app.fail() LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'disk on fire'; END $$;
CREATE PROCEDURE app.nap() LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(4); END $$;
"""


def chromium() -> str:
    """The distribution's chromium; without it the browser tests skip (CI installs it: .ci/run)."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"chromium is not installed at {CHROMIUM} (.ci/run installs it)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return CHROMIUM


def serve_console(app: App, tmp_path: Path, *args: str) -> Serve:
    return Serve(tmp_path, *args, env={"RADIXJOBS_DSN": app.dsn, "RADIXJOBS_HTTP_TOKEN": TOKEN},
                 name="console")


def request(url: str, method: str = "GET", headers: dict[str, str] | None = None,
            data: bytes | None = None) -> tuple[int, dict[str, str], str]:
    """Status, headers and body of one request (an error status is returned, not raised)."""
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def apply_document(app: App, num: int = 101, status: str = "CRON_TABLE_ACTIVE") -> None:
    """A CRON_TABLE document that calls app.archive_logs hourly (when ACTIVE)."""
    app.conn.execute("CREATE FUNCTION app.archive_logs() RETURNS void LANGUAGE sql AS 'SELECT'")
    doc: dict[str, Any] = {"dockind": "CRON_TABLE", "status": status,
                           "props": {"NUM": num, "DESCR": "hourly log archiving", "DB_FUNCTION": "app.archive_logs",
                                     "INTERVAL": "NOW() + INTERVAL '1 hour'", "RUN_AS": app.principal,
                                     "FIRST_RUN": "2025-01-01T00:00:00"}}
    store.apply(app.conn, doc)
