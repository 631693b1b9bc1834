"""The job page's dependency graph: the jobs a job runs after and the jobs that run after it, each linked to
its own page, with the condition of its edge."""

from __future__ import annotations

from pathlib import Path

from tests.apps import App
from tests.console.support import TOKEN, request, serve_console
from tests.support import wait_for


def test_the_job_page_draws_upstreams_and_dependents(app: App, tmp_path: Path) -> None:
    app.job("CREATE JOB app.pull SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('e')")
    app.job("CREATE JOB app.load SCHEDULE AFTER app.pull RUN AS {p} CALL app.record('l')")
    app.job("CREATE JOB app.report SCHEDULE AFTER app.load COMPLETES RUN AS {p} CALL app.record('r')")
    ids = dict(app.conn.execute("SELECT job_name, job_id::text FROM radix.jobs").fetchall())
    console = serve_console(app, tmp_path)
    try:
        wait_for(lambda: console.status()["databases"], message="the daemon to serve its database")
        db = app.conn.info.dbname
        status, _, page = request(f"{console.url}/db/{db}/job/{ids['load']}",
                                  headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, page
        assert 'id="dependencies"' in page
        assert f'href="/db/{db}/job/{ids["pull"]}"' in page
        assert f'href="/db/{db}/job/{ids["report"]}"' in page
        assert "app.pull · succeeds" in page
        assert "app.report · completes" in page
        status, _, page = request(f"{console.url}/db/{db}/job/{ids['pull']}",
                                  headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        assert "app.load · succeeds" in page
    finally:
        console.stop()
