"""Attempt capacity shared by the engines of one process (global) or owned by one (per database)."""

from __future__ import annotations


class Slots:
    """Reserve synchronously before claiming, release when an attempt ends: never more running than
    the capacity, and never a claim without a slot to run it."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.in_use = 0

    @property
    def free(self) -> int:
        return self.capacity - self.in_use

    def reserve(self, wanted: int) -> int:
        """Take up to ``wanted`` slots; returns how many were taken."""
        taken = max(0, min(wanted, self.free))
        self.in_use += taken
        return taken

    def release(self, count: int = 1) -> None:
        self.in_use = max(0, self.in_use - count)
