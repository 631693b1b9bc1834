"""The console in a real browser (headless Chromium driven by Playwright) against a daemon started here.

Log in with the token, see a job appear, watch attempts in the timeline, disable a job, open a failed
attempt's error, flip a document PASSIVE, see a running attempt on the Live page; no console errors.
Screenshots of every page: tests/console/browsing.py says where they go.
"""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Browser, Page

from tests.acceptance.serving import Serve
from tests.apps import App
from tests.console.browsing import Shots, job_url, log_in, open_page, shots_folder
from tests.console.support import apply_document, request
from tests.support import wait_for


def confirm(page: Page, label: str) -> str:
    page.click(f"a.button:text-is('{label}')")
    page.wait_for_selector("#question")
    page.click("#confirm")
    return page.inner_text("#flash")

def test_console_in_a_browser(app: App, console: Serve, browser: Browser, tmp_path: Path) -> None:
    errors: list[str] = []
    page = open_page(browser, errors)
    shots = Shots(page, shots_folder(tmp_path))

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

    apply_document(app)
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


