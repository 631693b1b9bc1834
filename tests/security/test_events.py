"""radix_events: any role may LISTEN on any channel, and NOTIFY on it. A listener learns of another owner's
failures only an opaque job id, a status, a category, an attempt and a planned time; a forged notification
makes the daemon post nothing (docs/security.md, *Failure events and hooks*)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from radixjobs.engine import Engine
from radixjobs.server.events import EventPoster, parse_event
from tests.apps import App
from tests.support import wait_for
from tests.webhook import Receiver

FAILING = """
CREATE PROCEDURE app.secret_failure(secret text) LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'the secret is %', secret USING ERRCODE = '22012';
END $$;
"""


def test_a_listener_of_another_role_learns_no_name_argument_or_error_text(app: App, roles: Any, login: Any) -> None:
    app.conn.execute(FAILING)
    app.job("CREATE JOB app.payroll_export SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} "
            "CALL app.secret_failure('hunter2') WITH (max_attempts = 1)")
    mallory = login(roles("mallory"))
    mallory.execute("LISTEN radix_events")
    app.run()
    (note,) = list(mallory.notifies(timeout=60, stop_after=1))
    event = json.loads(note.payload)
    assert set(event) == {"job_id", "status", "run_kind", "category", "attempt", "planned_ns"}
    assert (event["status"], event["run_kind"], event["attempt"]) == ("failed", "schedule", 1)
    for secret in ("payroll", "hunter2", "secret", app.principal):
        assert secret not in note.payload
    # and the id names nothing mallory may see
    assert mallory.execute("SELECT count(*) FROM radix.job_overview").fetchone() == (0,)


def test_a_forged_event_for_another_owner_s_job_is_not_posted(app: App, roles: Any, login: Any) -> None:
    app.job("CREATE JOB app.victim SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('v')")
    job_id = app.state("app.victim")["job_id"]
    forged = json.dumps({"job_id": str(job_id), "status": "failed", "run_kind": "schedule",
                         "category": "application", "attempt": 1, "planned_ns": 10**18})
    mallory = login(roles("mallory"))
    mallory.execute("SELECT pg_notify('radix_events', %s)", (forged,))  # allowed to any role
    event = parse_event("app", forged)
    assert event is not None  # shaped as radix._event sends one: only the history tells it apart

    async def deliver(poster: EventPoster) -> None:
        async with Engine(app.dsn) as engine:
            task = asyncio.create_task(poster.run())
            poster.offer(event, engine.failed_job_name)
            await asyncio.to_thread(wait_for, lambda: poster.counters["events_unverified"] == 1)
            task.cancel()
        await poster.close()

    with Receiver() as receiver:
        poster = EventPoster(receiver.url)
        asyncio.run(deliver(poster))
        assert receiver.requests == 0
