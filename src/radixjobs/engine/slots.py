"""Attempt capacity: an engine's own slots (per database), within a parent's (its cluster's, the node's).

Invariants:
- A slot is reserved synchronously before a claim or a start, and released when the attempt ends (or the
  claim returned fewer than reserved): never more running than the capacity, and never a claim without a
  slot to run it.
- With a parent, a slot is taken here and in the parent in the same call, and given back to both in the
  same call: the two counts are one reservation, and what is free here is never more than the parent's.
"""

from __future__ import annotations


class Slots:
    """Reserve before claiming, release when an attempt ends; ``parent``: the capacity this one is a share
    of (every slot taken here is taken there too)."""

    def __init__(self, capacity: int, parent: Slots | None = None):
        self.capacity = capacity
        self.in_use = 0
        self.parent = parent

    @property
    def free(self) -> int:
        own = self.capacity - self.in_use
        return own if self.parent is None else max(0, min(own, self.parent.free))

    @property
    def own_free(self) -> int:
        """Free here, whatever the parent has free."""
        return self.capacity - self.in_use

    def reserve(self, wanted: int) -> int:
        """Take up to ``wanted`` slots (here and in the parent); returns how many were taken."""
        taken = max(0, min(wanted, self.capacity - self.in_use))
        if self.parent is not None:
            taken = self.parent.reserve(taken)
        self.in_use += taken
        return taken

    def release(self, count: int = 1) -> None:
        """Give back ``count`` slots (never more than are held here), to the parent too."""
        count = max(0, min(count, self.in_use))
        self.in_use -= count
        if self.parent is not None:
            self.parent.release(count)
