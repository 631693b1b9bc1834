"""What an engine reports about its work besides its counters: the hooks it calls on its observer.

The engine declares them here and calls them; radixjobs.observe.Observer is the daemon's implementation
(histograms, and spans when OpenTelemetry is on). The engine never imports radixjobs.observe.

Invariants:
- a hook is called after the work it reports is done (a claim's round trip, an attempt's finalisation):
  it observes, it never decides anything the engine does next;
- a hook must not raise (the daemon's observer logs a failure of its exporter and goes on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from radixjobs.engine.attempt import Claim
    from radixjobs.engine.definitions import JobDefinition
    from radixjobs.engine.principals import PrincipalPools


class Observer(Protocol):
    """The engine's observer: ``Engine.observer`` (None: nothing is observed)."""

    def claimed(self, seconds: float) -> None:
        """A claim round trip took ``seconds``."""

    def attempt(self, job: JobDefinition, claim: Claim, result: str, started: float,
                principals: PrincipalPools) -> None:
        """An attempt was finalised with ``result``; ``started`` is its time.monotonic() at the start."""
