"""The console in a real browser (headless Chromium driven by Playwright) against a daemon started here.

Log in with the token, see a job appear, watch attempts in the timeline, disable a job, open a failed
attempt's error, flip a document PASSIVE, see a running attempt on the Live page; no console errors.
Screenshots of every page go to the test's folder (and to RADIXJOBS_CONSOLE_SHOTS when set: docs/console).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from radixjobs.documents import store
from radixjobs.sqlscript import split_script
from tests.acceptance.serving import Serve
from tests.apps import App
from tests.console.support import CONSOLE_SQL, TOKEN, chromium, request, serve_console
from tests.support import wait_for


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
    for stmt in split_script(CONSOLE_SQL):
        app.conn.execute(stmt.text.encode())
    app.job("CREATE JOB app.often SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.record('often')")
    app.job("CREATE JOB app.broken SCHEDULE EVERY INTERVAL '2 seconds' RUN AS {p} CALL app.fail()")
    daemon = serve_console(app, tmp_path)
    try:
        yield daemon
    finally:
        daemon.stop()

class Shots:
    def __init__(self, page: Page, folder: Path):
        self.page = page
        self.folder = folder
        folder.mkdir(exist_ok=True)
        self.extra = Path(os.environ["RADIXJOBS_CONSOLE_SHOTS"]) if os.environ.get("RADIXJOBS_CONSOLE_SHOTS") else None

    def take(self, name: str) -> None:
        path = self.folder / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if self.extra is not None:
            self.extra.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, self.extra / path.name)

def open_page(browser: Browser, errors: list[str]) -> Page:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    return page

def log_in(page: Page, url: str) -> None:
    page.goto(url + "/")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_selector("#db-count")

def job_url(app: App, console: Serve, name: str) -> str:
    row = app.conn.execute("SELECT job_id, current_database() FROM radix.job_overview WHERE name = %s",
                           (name,)).fetchone()
    assert row is not None
    return f"{console.url}/db/{row[1]}/job/{row[0]}"

def confirm(page: Page, label: str) -> str:
    page.click(f"a.button:text-is('{label}')")
    page.wait_for_selector("#question")
    page.click("#confirm")
    return page.inner_text("#flash")

def test_console_in_a_browser(app: App, console: Serve, browser: Browser, tmp_path: Path) -> None:
    errors: list[str] = []
    page = open_page(browser, errors)
    shots = Shots(page, tmp_path / "screenshots")

    page.goto(console.url + "/jobs")
    assert page.locator("input[name=token]").count() == 1  # not logged in: the login form, no data
    assert "app.often" not in page.content()
    shots.take("login")
    log_in(page, console.url)
    wait_for(lambda: int(page.inner_text("#attempts-min")) > 0 or (page.reload() and False), timeout=30,
             message="attempts on the overview")
    shots.take("overview")

    page.goto(console.url + "/jobs")
    page.wait_for_selector("tr[data-name='app.often']")
    app.job("CREATE JOB app.appears SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('late')")
    page.wait_for_selector("tr[data-name='app.appears']", timeout=20_000)  # the live refresh brings it
    shots.take("jobs")

    page.goto(job_url(app, console, "app.often"))
    page.wait_for_function("document.querySelectorAll('#timeline rect.attempt').length >= 2", timeout=30_000)
    assert page.locator("#history code").first.inner_text().strip()  # the tick's idempotency key
    shots.take("job")
    flash = confirm(page, "Disable")
    assert "disabled" in flash
    assert flash.startswith("done")
    assert page.inner_text("#enabled") == "no"
    assert app.state("app.often")["enabled"] is False

    page.goto(job_url(app, console, "app.broken"))
    page.wait_for_selector("tr[data-status=failed] details.error summary", timeout=30_000)
    page.click("tr[data-status=failed] details.error summary")
    assert "disk on fire" in page.inner_text("tr[data-status=failed] details.error .message")
    shots.take("job-failed")

    _document(app)
    page.goto(console.url + "/jobs?q=doc:")
    page.click("a:text-is('doc:101')")
    page.wait_for_selector("#document")
    shots.take("document")
    flash = confirm(page, "Make PASSIVE")
    assert flash.startswith("done"), flash
    assert "CRON_TABLE_PASSIVE" in page.inner_text("#document")

    app.job("CREATE JOB app.slow SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.nap()")
    page.goto(console.url + "/live")
    page.wait_for_selector("#running a:text-is('app.slow')", timeout=30_000)
    shots.take("live")
    assert errors == []

def test_run_now_shows_the_attempt_in_the_timeline(app: App, console: Serve, browser: Browser) -> None:
    """Run now calls radix.run_job (RUN JOB): the attempt appears in the timeline, the result is shown."""
    errors: list[str] = []
    page = open_page(browser, errors)
    log_in(page, console.url)
    app.job("CREATE JOB app.rare SCHEDULE EVERY INTERVAL '1 day' RUN AS {p} CALL app.record('rare')")
    page.goto(job_url(app, console, "app.rare"))
    before = page.locator("#timeline rect.attempt").count()
    flash = confirm(page, "Run now")
    assert flash.startswith("done: app.rare: run requested ("), flash
    # polled from here: a predicate polled in the page is evaluated as a string, which the console's CSP
    # (script-src 'self') refuses unless the attempt was already there when the page loaded
    wait_for(lambda: page.locator("#timeline rect.attempt").count() > before, timeout=30,
             message="the attempt in the timeline (live refresh)")
    assert errors == []

def _document(app: App) -> None:
    app.conn.execute("CREATE FUNCTION app.archive_logs() RETURNS void LANGUAGE sql AS 'SELECT'")
    doc: dict[str, Any] = {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE",
                           "props": {"NUM": 101, "DESCR": "hourly log archiving", "DB_FUNCTION": "app.archive_logs",
                                     "INTERVAL": "NOW() + INTERVAL '1 hour'", "RUN_AS": app.principal,
                                     "FIRST_RUN": "2025-01-01T00:00:00"}}
    store.apply(app.conn, doc)


def test_generated_token_is_printed_once_and_logs_in(app: App, tmp_path: Path) -> None:
    """Without --http-token the daemon prints the console URL with a random token, once, and never logs it."""
    daemon = Serve(tmp_path, env={"RADIXJOBS_DSN": app.dsn}, name="generated")
    try:
        text = wait_for(lambda: "console: " in daemon.log.read_text() and daemon.log.read_text(), timeout=30)
        match = re.search(r"console: (http://127\.0\.0\.1:\d+/login\?token=([\w-]+))", text)
        assert match, text[-2000:]
        assert len(match[2]) >= 32
        assert text.count(match[2]) == 1
        status, headers, _ = request(match[1])
        assert status == 303
        cookie = headers["set-cookie"].split(";")[0]
        assert request(daemon.url + "/jobs", headers={"Cookie": cookie})[0] == 200
        assert request(daemon.url + "/login?token=wrong-token-guess")[0] == 401
    finally:
        daemon.stop()


