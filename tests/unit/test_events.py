"""serve --notify-url (server/events.py): which radix_events payloads are taken, and the poster's bounded queue,
timeout, retries and checks, against a loopback receiver."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from radixjobs.server.events import Event, EventPoster, parse_event
from tests.webhook import Receiver

JOB = uuid.UUID("0b3c1a52-52c5-4d0a-9d67-6ad2a8b1f0e1")
PAYLOAD = {"job_id": str(JOB), "status": "failed", "run_kind": "schedule", "category": "application",
           "attempt": 3, "planned_ns": 1_577_836_800_123_456_789}


def test_a_payload_as_radix_event_sends_it_is_an_event() -> None:
    event = parse_event("app", json.dumps(PAYLOAD))
    assert event == Event("app", JOB, "failed", "schedule", "application", 3, 1_577_836_800_123_456_789)
    assert event.body("app.f") == {
        "event": "job_failed", "database": "app", "job": "app.f", "job_id": str(JOB), "status": "failed",
        "run_kind": "schedule", "category": "application", "attempt": 3, "planned_ns": 1_577_836_800_123_456_789,
        "planned_at": "2020-01-01T00:00:00.123456+00:00"}


@pytest.mark.parametrize("payload", [
    "", "not json", "[]", json.dumps({**PAYLOAD, "job_id": "x"}), json.dumps({**PAYLOAD, "status": "ok"}),
    json.dumps({**PAYLOAD, "run_kind": "other"}), json.dumps({**PAYLOAD, "attempt": "3"}),
    json.dumps({**PAYLOAD, "attempt": True}), json.dumps({**PAYLOAD, "planned_ns": -1}),
    json.dumps({**PAYLOAD, "category": 5}), json.dumps({k: v for k, v in PAYLOAD.items() if k != "attempt"}),
    json.dumps({**PAYLOAD, "padding": "x" * 2000}),
])
def test_anything_else_on_the_channel_is_not_an_event(payload: str) -> None:
    assert parse_event("app", payload) is None


async def _deliver(poster: EventPoster, events: list[Event], resolve: Any, until: Any) -> None:
    task = asyncio.create_task(poster.run())
    try:
        for event in events:
            poster.offer(event, resolve)
        for _ in range(3000):  # at most 30 s: a condition, polled
            if until():
                break
            await asyncio.sleep(0.01)
        assert until()
    finally:
        task.cancel()
        await poster.close()


def _event(attempt: int = 1) -> Event:
    return Event("app", JOB, "failed", "schedule", "application", attempt, 10**18)


async def _named(*_: object) -> str:
    return "app.f"


async def _unknown(*_: object) -> None:
    return None


def test_events_are_posted_after_failed_tries_and_checked_against_the_history() -> None:
    with Receiver(statuses=(500, 503)) as receiver:
        poster = EventPoster(receiver.url, backoff_s=0.01)
        asyncio.run(_deliver(poster, [_event()], _named, lambda: poster.counters["events_posted"] == 1))
        assert receiver.requests == 3
        assert [b["job"] for b in receiver.bodies] == ["app.f"]
    with Receiver() as receiver:
        poster = EventPoster(receiver.url)
        asyncio.run(_deliver(poster, [_event()], _unknown, lambda: poster.counters["events_unverified"] == 1))
        assert receiver.requests == 0  # a NOTIFY any role could send, with no failure behind it


def test_tries_are_bounded_and_a_full_queue_drops() -> None:
    with Receiver(statuses=(500,) * 10) as receiver:
        poster = EventPoster(receiver.url, queue_size=2, tries=2, backoff_s=0.01)
        events = [_event(n) for n in range(1, 5)]  # two fit in the queue before the task takes one
        asyncio.run(_deliver(poster, events, _named, lambda: poster.counters["events_failed"] == 2))
        assert (poster.counters["events_dropped"], poster.counters["events_posted"]) == (2, 0)
        assert receiver.requests == 4


def test_an_unanswered_post_times_out() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers; the poster's timeout ends the request
        writer.close()
        await writer.wait_closed()

    async def go() -> None:
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        poster = EventPoster(f"http://127.0.0.1:{port}/", timeout_s=0.2, tries=2, backoff_s=0.01)
        async with server:
            await _deliver(poster, [_event()], _named, lambda: poster.counters["events_failed"] == 1)

    asyncio.run(go())
