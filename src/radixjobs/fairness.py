"""The fairness policy shared by job claims and document runs (pure; see docs/security.md "Fair claims").

Invariants: a principal (the RUN AS role) never gets a slot while it holds ``cap`` of them (0: no cap), and
free slots go first to the principals with the fewest held, ties to the one this node served least
recently (``Served``), then to the oldest due work. Jobs apply this in the database (radix.claim_due,
counting every node) and in the engine's queue of found ticks (engine/ticks.py); documents apply it per node
(``fair_order``). An engine's long attempts (a job timeout above ``Reserve.long_ms``) never hold more than
``Reserve.long_cap`` of its slots: the others are kept for attempts that end within the threshold.
"""

from __future__ import annotations

import collections
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

# An attempt whose job's timeout is above this is long (serve --long-attempt): just above the default job
# timeout of 240 s, so jobs left at the default are never long.
LONG_ATTEMPT_S = 300.0
# Principals an engine remembers serving (the least recently served forgotten first: it then counts as
# never served, which puts it where it was, first).
SERVED_LIMIT = 256


def principal_cap(concurrency: int, max_per_principal: int | None) -> int:
    """The running attempts one principal may hold in a database (0: no cap). Default: half the slots (at
    least one), so one principal's due work always leaves slots for the others'."""
    if max_per_principal is None:
        return max(1, concurrency // 2)
    if max_per_principal < 0:
        raise ValueError("max_per_principal must be 0 (no cap) or more")
    return max_per_principal


def reserved_slots(concurrency: int, reserved: int | None) -> int:
    """The slots of an engine that long attempts may not hold. Default: a quarter of them, at least one when
    there are two or more. All of them: no long attempt runs there."""
    if reserved is None:
        return max(1, concurrency // 4) if concurrency >= 2 else 0
    if not 0 <= reserved <= concurrency:
        raise ValueError(f"{reserved} reserved slots: expected 0 to the {concurrency} slots")
    return reserved


@dataclass(frozen=True)
class Reserve:
    """Which attempts are long, and how many of them one engine may run at once."""

    long_ms: int  # an attempt whose job's timeout (deadline_ms) is above this is long
    long_cap: int  # the engine's slots less the reserved ones

    @classmethod
    def of(cls, concurrency: int, reserved: int | None, long_attempt_s: float) -> Reserve:
        if long_attempt_s <= 0:
            raise ValueError("long_attempt_s must be more than 0")
        return cls(int(long_attempt_s * 1000), concurrency - reserved_slots(concurrency, reserved))

    def is_long(self, deadline_ms: int) -> bool:
        return deadline_ms > self.long_ms

    def long_free(self, long_running: int) -> int:
        """How many more long attempts may start while ``long_running`` run."""
        return max(0, self.long_cap - long_running)


class Served:
    """The principals this node started attempts for, least recently first (bounded by SERVED_LIMIT):
    the tie-break among principals with as few running, so none is served twice while another waits."""

    def __init__(self, limit: int = SERVED_LIMIT) -> None:
        self.limit = limit
        self._order: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._sequence = 0

    def note(self, principal: int) -> None:
        self._sequence += 1
        self._order[principal] = self._sequence
        self._order.move_to_end(principal)
        if len(self._order) > self.limit:
            self._order.popitem(last=False)

    def rank(self, principal: int) -> int:
        """Lower for less recently served; 0 for never (or forgotten)."""
        return self._order.get(principal, 0)

    def oldest_first(self) -> list[int]:
        """The remembered principals, least recently served first (radix.claim_due's ``served``)."""
        return list(self._order)


def fair_order(items: Iterable[T], key: Callable[[T], K], held: Mapping[K, int]) -> list[T]:
    """``items`` (in due order) interleaved round-robin by ``key``: the n-th item of a principal that already
    holds h slots goes at level h + n; lower levels first, due order within a level."""
    seen: Counter[K] = Counter(held)
    ranked = []
    for index, item in enumerate(items):
        seen[key(item)] += 1
        ranked.append((seen[key(item)], index, item))
    return [item for _, _, item in sorted(ranked, key=lambda r: (r[0], r[1]))]
