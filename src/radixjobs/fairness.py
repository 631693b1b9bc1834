"""The fairness policy shared by job claims and document runs (pure; see docs/security.md "Fair claims").

Invariants: a principal (the RUN AS role) never gets a slot while it holds ``cap`` of them (0: no cap), and
free slots go first to the principals with the fewest held, ties to the oldest due work. Jobs apply this in
the database (radix.claim_due, counting every node); documents apply it per node (``fair_order``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def principal_cap(concurrency: int, max_per_principal: int | None) -> int:
    """The running attempts one principal may hold in a database (0: no cap). Default: half the slots (at
    least one), so one principal's due work always leaves slots for the others'."""
    if max_per_principal is None:
        return max(1, concurrency // 2)
    if max_per_principal < 0:
        raise ValueError("max_per_principal must be 0 (no cap) or more")
    return max_per_principal


def fair_order(items: Iterable[T], key: Callable[[T], K], held: Mapping[K, int]) -> list[T]:
    """``items`` (in due order) interleaved round-robin by ``key``: the n-th item of a principal that already
    holds h slots goes at level h + n; lower levels first, due order within a level."""
    seen: Counter[K] = Counter(held)
    ranked = []
    for index, item in enumerate(items):
        seen[key(item)] += 1
        ranked.append((seen[key(item)], index, item))
    return [item for _, _, item in sorted(ranked, key=lambda r: (r[0], r[1]))]
