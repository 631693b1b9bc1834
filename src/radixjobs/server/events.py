"""``serve --notify-url URL``: the radix_events notifications of every database served, POSTed as JSON.

A tick that fails for good (after its retries) sends ``NOTIFY radix_events`` in the transaction that records
the failure (radix._event, sql/routines/hooks.sql): the job's id, the status, what ran the tick, the error's
category, the attempt and the tick's planned time, and nothing more, since every role may LISTEN. Each
database's owner already has a LISTEN connection (server/owner.py); with a URL it listens on radix_events
too and hands each event here.

Invariants:
- Scheduling is never delayed: an owner hands an event over with a non-blocking put on a bounded queue
  (QUEUE_SIZE); a full queue drops the event and counts it (``events_dropped``). One task posts.
- Any role may NOTIFY radix_events with any payload: an event is posted only when its shape is radix._event's
  and the history has that failure (read with the scheduler's rights, which also name the job); anything
  else is counted (``events_unverified``) and dropped.
- Every POST has a timeout (TIMEOUT_S) and at most TRIES tries, BACKOFF_S doubling between them; an event
  still not accepted (a 2xx answer) is counted (``events_failed``) and dropped. The counters are the fixed
  set COUNTER_KEYS.
- The body names the job (the webhook is the operator's), never its arguments or an error text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

log = logging.getLogger("radixjobs.server")

EVENTS_CHANNEL = "radix_events"
QUEUE_SIZE = 1000
TIMEOUT_S = 5.0  # each POST, connect to last byte
TRIES = 3
BACKOFF_S = 0.5
RESOLVE_TIMEOUT_S = 5.0
COUNTER_KEYS = ("events_posted", "events_dropped", "events_failed", "events_unverified")
STATUSES = frozenset({"failed"})
RUN_KINDS = frozenset({"schedule", "run", "backfill", "after", "on_failure"})
MAX_PAYLOAD = 1000  # radix._event's payload is about 200 bytes

# (job id, planned ns, attempt, run kind) -> the job's qualified name when the history has that failure
Resolve = Callable[[uuid.UUID, int, int, str], Awaitable[str | None]]


@dataclass(frozen=True)
class Event:
    """One radix_events notification of a database, as radix._event shapes it."""

    database: str
    job_id: uuid.UUID
    status: str
    run_kind: str
    category: str | None
    attempt: int
    planned_ns: int

    def body(self, job: str) -> dict[str, Any]:
        """The JSON document POSTed for it, ``job`` its qualified name."""
        planned_at = datetime.fromtimestamp(self.planned_ns // 10**9, UTC).replace(
            microsecond=self.planned_ns % 10**9 // 1000)
        return {"event": "job_" + self.status, "database": self.database, "job": job, "job_id": str(self.job_id),
                "status": self.status, "run_kind": self.run_kind, "category": self.category,
                "attempt": self.attempt, "planned_ns": self.planned_ns, "planned_at": planned_at.isoformat()}


def parse_event(database: str, payload: str) -> Event | None:
    """The event of a notification's payload, or None when it is not shaped as radix._event sends one."""
    if len(payload) > MAX_PAYLOAD:
        return None
    try:
        doc = json.loads(payload)
        event = Event(database, uuid.UUID(doc["job_id"]), doc["status"], doc["run_kind"], doc["category"],
                      doc["attempt"], doc["planned_ns"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if (event.status not in STATUSES or event.run_kind not in RUN_KINDS
            or not isinstance(event.category, str | None) or type(event.attempt) is not int
            or type(event.planned_ns) is not int or not 0 <= event.planned_ns < 2**63):
        return None
    return event


class EventPoster:
    """Posts the events offered to it to ``url``, one at a time, from its own task (``run``)."""

    def __init__(self, url: str, *, queue_size: int = QUEUE_SIZE, timeout_s: float = TIMEOUT_S,
                 tries: int = TRIES, backoff_s: float = BACKOFF_S):
        self.url = url
        self.tries = tries
        self.backoff_s = backoff_s
        self.counters: Counter[str] = Counter(dict.fromkeys(COUNTER_KEYS, 0))
        self._queue: asyncio.Queue[tuple[Event, Resolve]] = asyncio.Queue(queue_size)
        self._client = httpx.AsyncClient(timeout=timeout_s, follow_redirects=False, trust_env=False)

    def offer(self, event: Event, resolve: Resolve) -> bool:
        """Queue ``event`` (``resolve`` checks it against its database's history); False: dropped, the queue is
        full."""
        try:
            self._queue.put_nowait((event, resolve))
        except asyncio.QueueFull:
            self.counters["events_dropped"] += 1
            return False
        return True

    async def run(self) -> None:
        """Post the queued events until cancelled."""
        while True:
            event, resolve = await self._queue.get()
            try:
                await self._deliver(event, resolve)
            except Exception as exc:  # a bug must not end the task: logged, counted, next event
                self.counters["events_failed"] += 1
                log.error("event delivery failed db=%s job_id=%s error=%s", event.database, event.job_id,
                          type(exc).__name__, exc_info=exc)

    async def close(self) -> None:
        await self._client.aclose()

    async def _deliver(self, event: Event, resolve: Resolve) -> None:
        job: str | None = None
        with contextlib.suppress(Exception):  # the database gone, or slow: not verified
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                job = await resolve(event.job_id, event.planned_ns, event.attempt, event.run_kind)
        if job is None:
            self.counters["events_unverified"] += 1
            log.warning("radix_events notification not in the history; not posted db=%s job_id=%s",
                        event.database, event.job_id)
            return
        if await self._post(event.body(job)):
            self.counters["events_posted"] += 1
        else:
            self.counters["events_failed"] += 1
            log.warning("event not delivered to --notify-url after %s tries db=%s job=%s", self.tries,
                        event.database, job)

    async def _post(self, body: dict[str, Any]) -> bool:
        """POST ``body``; True once a try is answered 2xx, False after ``tries`` tries."""
        for attempt in range(self.tries):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = await self._client.post(self.url, json=body)
            except httpx.HTTPError:
                continue
            if response.is_success:
                return True
        return False
