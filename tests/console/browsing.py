"""Helpers of the browser tests: a page that records the browser's errors, the login, screenshots.

Screenshots go to ``RADIXJOBS_SCREENSHOTS`` when set (.ci/run: ``.ci/artifacts/screenshots``, kept as a CI
artifact), else to the test's own folder; and to ``RADIXJOBS_CONSOLE_SHOTS`` too when set (docs/console).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from playwright.sync_api import Browser, Page

from tests.acceptance.serving import Serve
from tests.apps import App
from tests.console.support import TOKEN


def shots_folder(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("RADIXJOBS_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Shots:
    def __init__(self, page: Page, folder: Path):
        self.page = page
        self.folder = folder
        self.extra = Path(os.environ["RADIXJOBS_CONSOLE_SHOTS"]) if os.environ.get("RADIXJOBS_CONSOLE_SHOTS") else None

    def take(self, name: str) -> Path:
        path = self.folder / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if self.extra is not None:
            self.extra.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, self.extra / path.name)
        return path


def open_page(browser: Browser, errors: list[str], width: int = 1280, height: int = 800) -> Page:
    """A new page (its own context: cookies are not shared) whose console errors and warnings and page
    errors are appended to ``errors``."""
    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
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
