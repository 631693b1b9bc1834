"""`make run` (serve --demo on the embedded server) prints the console URL with its one-time token, and every
page renders with live data from the demo job."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from radixjobs.embedded import EmbeddedServer
from tests.acceptance.serving import Serve
from tests.console.support import request
from tests.support import wait_for


def test_demo_prints_the_console_url_and_every_page_shows_the_demo_job(tmp_path: Path) -> None:
    home = tmp_path / "home"
    daemon = Serve(tmp_path, "--demo", "--home", str(home), name="demo")
    try:
        match = wait_for(lambda: re.search(r"console: (http://127\.0\.0\.1:\d+/login\?token=[\w-]+)",
                                           daemon.log.read_text()), timeout=30, message="the console URL")
        status, headers, _ = request(match[1])
        assert status == 303
        cookie = {"Cookie": headers["set-cookie"].split(";")[0]}
        wait_for(lambda: daemon.status()["counters"]["successes"] >= 1, timeout=60, message="a demo run")
        _, _, jobs = request(daemon.url + "/jobs", headers=cookie)
        assert "demo.heartbeat" in jobs
        assert "every 5 seconds" in jobs
        link = re.search(r'href="(/db/[^"]+/job/[0-9a-f-]+)"', jobs)
        assert link
        _, _, job = request(daemon.url + link[1], headers=cookie)
        assert 'class="attempt-row" data-status="succeeded"' in job
        assert 'rect x="' in job  # the timeline has the attempt
        for path in ("/", "/live"):
            status, _, body = request(daemon.url + path, headers=cookie)
            assert status == 200
            assert "flash bad" not in body
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
    finally:
        daemon.stop()
        EmbeddedServer(home).destroy()
