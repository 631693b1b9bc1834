"""Every console page fits a phone (390×844) and a desktop (1400×900): the page itself never scrolls
sideways (wide tables scroll inside their card or become cards), and a screenshot of each page at both
widths is kept (tests/console/browsing.py says where: CI keeps them as an artifact)."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Browser, Page

from tests.acceptance.serving import Serve
from tests.apps import App
from tests.console.browsing import Shots, job_url, log_in, open_page, shots_folder
from tests.console.support import apply_document

VIEWPORTS = {"phone": (390, 844), "desktop": (1400, 900)}
WIDTHS = "() => [document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]"


def overflow(page: Page, name: str) -> list[str]:
    """What of the page is wider than the window (nothing: [])."""
    root, body, inner = page.evaluate(WIDTHS)
    return [f"{name}: the {what} is {size} px wide in a {inner} px window"
            for what, size in (("page", root), ("body", body)) if size > inner]


def pages(app: App, console: Serve) -> dict[str, tuple[str, str]]:
    """Name → (URL, a selector the page shows once its data is there)."""
    db = app.conn.info.dbname
    load = job_url(app, console, "app.nightly_warehouse_load")
    return {
        "overview": (console.url + "/", "#attempts-min"),
        "jobs": (console.url + "/jobs", "tr[data-name='app.nightly_warehouse_load']"),
        "live": (console.url + "/live", "#running a"),
        "job": (load, "#timeline rect.attempt"),
        "job-failed": (job_url(app, console, "app.broken"), "tr[data-status=failed]"),
        "document": (f"{console.url}/db/{db}/document/101", "#document"),
        "confirm": (f"{console.url}/confirm?action=disable&db={db}&target=app.nightly_warehouse_load&back=/jobs",
                    "#question"),
        "missing-job": (f"{console.url}/db/{db}/job/00000000-0000-0000-0000-000000000000", "h1"),
        "missing-page": (console.url + "/no/such/page", "h1"),
    }


def test_every_page_fits_a_phone_and_a_desktop(app: App, console: Serve, browser: Browser,
                                                  tmp_path: Path) -> None:
    app.job("CREATE JOB app.nightly_warehouse_load SCHEDULE AFTER app.often RUN AS {p} "
            "CALL app.record('a long argument that a narrow screen has to wrap somewhere')")
    app.job("CREATE JOB app.nightly_warehouse_report SCHEDULE AFTER app.nightly_warehouse_load COMPLETES "
            "RUN AS {p} CALL app.record('report')")
    app.job("CREATE JOB app.slow SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.nap()")
    apply_document(app)
    folder = shots_folder(tmp_path)
    too_wide: list[str] = []
    for label, (width, height) in VIEWPORTS.items():
        errors: list[str] = []
        page = open_page(browser, errors, width, height)
        shots = Shots(page, folder)
        page.goto(console.url + "/")
        page.wait_for_selector("input[name=token]")
        too_wide += overflow(page, f"login at {label}")
        shots.take(f"login-{width}")
        log_in(page, console.url)
        for name, (url, ready) in pages(app, console).items():
            page.goto(url)
            page.wait_for_selector(ready, timeout=30_000)
            too_wide += overflow(page, f"{name} at {label}")
            shots.take(f"{name}-{width}")
            if name.startswith("missing"):  # the browser reports the 404 status itself
                errors[:] = [e for e in errors if "404" not in e]
        assert errors == [], label
        page.context.close()
    assert too_wide == []
