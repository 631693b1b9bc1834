"""What an engine has in flight: the one state its parts share (engine/runner.py composes them).

The dispatcher (engine/dispatch.py) adds to it when it starts an attempt; the tick runner, the batch runner
and the lease runner take their own entries out when their attempt is over; the lease keeper
(engine/leases.py) reads the leases held; the outcome recorder notes the next tick of a job whose attempt
ended (``ahead``).

Invariants:
- Every attempt running here (a claim, a lone tick or a batch) is one task in ``tasks`` and holds one slot
  of ``slots`` from its start until its task is done (``attempt_done``).
- ``leases`` holds the token of every lease this engine's attempts hold (a claim, a tick published or
  recorded as a lease) while they run: exactly the leases renewed, and none after its attempt ended.
- A tick is in ``ticks`` (by job) from its start until its attempt is over, so the finder skips it; each
  principal connection running ticks (a lone tick, or a batch) counts once in ``tick_connections``, under
  its principal, for the same time, and so does each item of another source (engine/work.py) while it runs.
- Long attempts in ``long_tasks`` and long claims made and not yet started (``long_claims``) together never
  exceed the engine's ``Reserve.long_cap`` (the dispatcher asks ``long_running`` before it takes more).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass, field

from radixjobs.engine.slots import Slots
from radixjobs.engine.ticks import Tick


@dataclass(eq=False)
class InFlight:
    """The attempts running here, and what they hold."""

    slots: Slots  # one per attempt running
    finished: asyncio.Event  # set whenever an attempt ends (a caller's own, or the engine's)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # every attempt running here …
    long_tasks: set[asyncio.Task[None]] = field(default_factory=set)  # … and the long ones among them
    long_claims: set[uuid.UUID] = field(default_factory=set)  # lease tokens of long claims not yet started
    leases: set[uuid.UUID] = field(default_factory=set)  # lease tokens of the attempts running here
    ticks: dict[uuid.UUID, Tick] = field(default_factory=dict)  # ticks running here, by job
    # principal oid -> connections running its ticks here (a lone tick or a batch: one each) or its items
    tick_connections: Counter[int] = field(default_factory=Counter)
    ahead: float | None = None  # the earliest next tick of a job whose attempt ended here, not yet looked for

    @property
    def long_running(self) -> int:
        """Long attempts running here, and long claims made and not yet started."""
        return len(self.long_tasks) + len(self.long_claims)

    def ticks_ended(self, ticks: list[Tick]) -> None:
        """The ticks of one principal connection (one tick, or a batch) are over here."""
        for tick in ticks:
            self.ticks.pop(tick.job_id, None)
        self.principal_done(ticks[0].principal)

    def principal_done(self, principal: int) -> None:
        """One of ``principal``'s connections running here (ticks, or another source's item) is done."""
        self.tick_connections[principal] -= 1
        if self.tick_connections[principal] <= 0:
            del self.tick_connections[principal]

    def held_leases(self) -> set[uuid.UUID]:
        """A copy of the leases held now (for the lease keeper, which renews them meanwhile)."""
        return set(self.leases)
