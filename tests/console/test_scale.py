"""The Jobs page with 10,000 jobs: paged in the database, so a page costs about the same whatever the count.

Measured, not asserted (docs/console.md notes the figure): the render time of the first and last page, a
text filter and the overview, median of a few requests with the bearer token.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from tests.apps import App
from tests.console.support import TOKEN, request, serve_console

JOBS = 10_000

NOOP = "CREATE PROCEDURE app.noop() LANGUAGE sql AS 'SELECT 1'"
CREATE = """
DO $$ BEGIN
  FOR i IN 1..{n} LOOP
    PERFORM radix.create_job('app.scale_' || i, '{{"every_ns": 3600000000000}}', '{p}', 'app.noop', '[]',
                             i % 100 = 0, false, 240000);
  END LOOP;
END $$;
"""


def _time(url: str) -> float:
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        status, _, body = request(url, headers={"Authorization": f"Bearer {TOKEN}"})
        samples.append(time.perf_counter() - start)
        assert status == 200, body[:500]
    return statistics.median(samples)


@pytest.mark.slow
def test_jobs_page_with_ten_thousand_jobs(app: App, tmp_path: Path) -> None:
    app.conn.execute(NOOP)
    app.conn.execute(CREATE.format(n=JOBS, p=app.principal).encode())
    count = app.conn.execute("SELECT count(*) FROM radix.jobs").fetchone()
    assert count == (JOBS,)
    daemon = serve_console(app, tmp_path)
    try:
        pages = {"first page": "/jobs", "last page": f"/jobs?page={JOBS // 50}", "text filter": "/jobs?q=scale_9999",
                 "state filter": "/jobs?state=disabled&page=3", "overview": "/"}
        timings = {name: round(_time(daemon.url + path) * 1000, 1) for name, path in pages.items()}
        _, _, body = request(daemon.url + "/jobs?q=scale_9999", headers={"Authorization": f"Bearer {TOKEN}"})
        assert "app.scale_9999" in body
        _, _, body = request(daemon.url + "/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert f"{JOBS} in all" in body
    finally:
        daemon.stop()
    (tmp_path / "timings.json").write_text(json.dumps(timings, indent=2))
    print(f"console render times with {JOBS} jobs (ms, median of 5): {timings}")
