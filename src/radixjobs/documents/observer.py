"""What the documents report about their runs besides their counters: the hook they call on their observer.

The runner (documents/runner.py) declares it here and calls it; radixjobs.observe.Observer is the daemon's
implementation (the attempt histogram, and a span per run, ``radixjobs.kind`` document, when OpenTelemetry
is on). The documents never import radixjobs.observe.

Invariants:
- the hook is called after the run it reports has ended and its outcome is recorded: it observes, it never
  decides anything the runner does next;
- the hook must not raise (the daemon's observer logs a failure of its exporter and goes on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from radixjobs.documents.model import Started
    from radixjobs.engine.principals import PrincipalPools


class Observer(Protocol):
    """The documents' observer: ``Documents.observer`` (None: nothing is observed)."""

    def document_run(self, num: str, started: Started, error: str | None, began: float, rerun: bool,
                     principals: PrincipalPools) -> None:
        """A CRON_TABLE run ended (``error`` None: completed); ``began`` is its time.monotonic() start."""
