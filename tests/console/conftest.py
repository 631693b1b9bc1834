"""The browser and the daemon with its console, for the browser tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from radixjobs.sqlscript import split_script
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.console.support import CONSOLE_SQL, chromium, serve_console


@pytest.fixture
def browser() -> Iterator[Browser]:
    executable = chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def console(app: App, tmp_path: Path) -> Iterator[Serve]:
    """A daemon serving a job that succeeds every second and one that fails every 2 seconds."""
    for stmt in split_script(CONSOLE_SQL):
        app.conn.execute(stmt.text.encode())
    app.job("CREATE JOB app.often SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('often')")
    app.job("CREATE JOB app.broken SCHEDULE EVERY INTERVAL '2 seconds' RUN AS {p} CALL app.fail()")
    daemon = serve_console(app, tmp_path)
    try:
        yield daemon
    finally:
        daemon.stop()
