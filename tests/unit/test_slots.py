"""An engine's slots within a parent's (engine/slots.py): one reservation, taken and given back in both."""

from __future__ import annotations

from radixjobs.engine.slots import Slots


def test_slots_without_a_parent_are_their_own_capacity() -> None:
    slots = Slots(3)
    assert slots.reserve(5) == 3
    assert (slots.free, slots.own_free) == (0, 0)
    slots.release(4)  # never more than it holds
    assert (slots.in_use, slots.free) == (0, 3)


def test_a_slot_is_taken_and_given_back_in_the_parent_at_once() -> None:
    node = Slots(4)
    one, two = Slots(3, parent=node), Slots(3, parent=node)
    assert one.reserve(3) == 3
    assert (one.free, two.free, node.free) == (0, 1, 1)
    assert two.reserve(3) == 1  # the parent bounds the sum
    assert (two.free, two.own_free, node.free) == (0, 2, 0)
    one.release(2)
    assert (one.in_use, two.free, node.in_use) == (1, 2, 2)
    two.release(5)  # never more than it holds, here or in the parent
    assert (two.in_use, node.in_use) == (0, 1)


def test_a_chain_of_parents_reserves_in_every_one() -> None:
    node = Slots(2)
    cluster = Slots(5, parent=node)
    engine = Slots(5, parent=cluster)
    assert engine.reserve(5) == 2
    assert (engine.in_use, cluster.in_use, node.in_use) == (2, 2, 2)
    engine.release(2)
    assert (engine.in_use, cluster.in_use, node.in_use) == (0, 0, 0)
