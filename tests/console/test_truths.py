"""What the console's pages say is true: a node's "registered" (never a "last seen" nobody updates), the
lateness chart from its first attempt, a running job's start (not a next run "ago"), a job's arguments as
the CLI shows them, no next run for a document that is not ACTIVE, a 404 page with the layout."""

from __future__ import annotations

import re
from pathlib import Path

from tests.acceptance.serving import Serve
from tests.apps import App
from tests.console.support import TOKEN, apply_document, request, serve_console
from tests.support import wait_for

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def _get(daemon: Serve, path: str, **headers: str) -> str:
    status, _, body = request(daemon.url + path, headers={**BEARER, **headers})
    assert status == 200, (path, status, body[:300])
    return body


def _row(body: str, name: str) -> str:
    match = re.search(rf'<tr data-name="{re.escape(name)}">(.*?)</tr>', body, re.S)
    assert match, name
    return match[1]


def test_the_pages_say_what_is_true(app: App, tmp_path: Path) -> None:
    app.conn.execute("CREATE PROCEDURE app.nap() LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(4); END $$")
    app.job("CREATE JOB app.slow SCHEDULE EVERY INTERVAL '1 second' RUN AS {p} CALL app.nap()")
    app.job("CREATE JOB app.tagged SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record(tag => 'x')")
    apply_document(app)
    daemon = serve_console(app, tmp_path)
    try:
        # the first attempt is a lone point of the lateness chart: drawn as dots
        overview = wait_for(lambda: 'class="dot p50"' in (got := _get(daemon, "/")) and got, timeout=30, interval=0.3,
                            message="a dot on the lateness chart")
        assert "last seen" not in overview
        assert re.search(r"<th>registered</th>", overview)

        # a running job: since when it runs, never a next run "… ago"
        jobs = wait_for(lambda: 'class="state running"' in _row(got := _get(daemon, "/jobs"), "app.slow")
                        and got, timeout=30, interval=0.3, message="app.slow running on the jobs page")
        slow = _row(jobs, "app.slow")
        assert "running since" in slow
        assert " ago" not in slow
        job_id = app.conn.execute("SELECT job_id FROM radix.jobs WHERE job_name = 'tagged'").fetchone()
        assert job_id is not None
        db = app.conn.info.dbname
        page = _get(daemon, f"/db/{db}/job/{job_id[0]}")
        assert "tag =&gt; &#34;x&#34;::text" in page  # catalog.describe_arguments, as `jobs show`
        assert "type_oid" not in page

        # a document made PASSIVE after it ran keeps its NEXT_RUN property, but it has no next run
        wait_for(lambda: app.conn.execute("SELECT next_run FROM radix.document_overview").fetchone()[0],
                 timeout=30, interval=0.3, message="the document's first run")  # type: ignore[index]
        status, _, result = request(daemon.url + "/action", "POST", {**BEARER, "Content-Type":
                                    "application/x-www-form-urlencoded"},
                                    f"action=passivate&db={db}&target=101".encode())
        assert status == 200, result
        kept = app.conn.execute("SELECT status, next_run FROM radix.document_overview").fetchone()
        assert kept is not None
        assert kept[0] == "CRON_TABLE_PASSIVE"
        assert kept[1] is not None  # the stored property the page used to show
        jobs = _get(daemon, "/jobs")
        document = _get(daemon, f"/db/{db}/document/101")
        next_run = re.search(r'<dd id="next-run">(.*?)</dd>', document, re.S)
        assert next_run
        assert next_run[1].startswith("—")
        assert "<time" not in next_run[1]
        assert "<time" not in _row(jobs, "doc:101").split('data-label="next run"')[1].split("</td>")[0]

        # an address no route serves: the layout, with a way back
        status, _, missing = request(daemon.url + "/no/such/page", headers={**BEARER, "Accept": "text/html"})
        assert status == 404
        assert "<header>" in missing
        assert 'href="/login"' in missing  # a bearer token is no session: the way back is the login
        assert request(daemon.url + "/no/such/page")[0] == 404
    finally:
        daemon.stop()
