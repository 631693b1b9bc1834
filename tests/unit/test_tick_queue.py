"""The daemon's queue of found ticks and its memory of procedures' durations (engine/ticks.py), as batches
(engine/batches.py) use them: a batch takes only due ticks that no slot took, the others keep their places, and
no more than fit the batch's time budget at the procedure's last duration."""

from __future__ import annotations

import uuid

import pytest

from radixjobs.engine.ticks import (
    BATCH_BUDGET_MS,
    BATCH_TICK_MS,
    FIND_AHEAD_S,
    HORIZON_MS,
    Durations,
    Tick,
    TickQueue,
    wake_in,
)
from radixjobs.fairness import Reserve, Served


def _tick(principal: int, due_at: float, n: int, deadline_ms: int = 240_000) -> Tick:
    return Tick(uuid.UUID(int=n), 1, n, 0, 0, 0, due_at, uuid.UUID(int=n), principal, 0, deadline_ms)


def test_a_batch_takes_the_due_ticks_left_over_that_fit_and_keeps_the_others_in_order() -> None:
    queue = TickQueue()
    ticks = [_tick(1, 0.0, n) for n in range(6)] + [_tick(1, 5.0, 6), _tick(2, 0.0, 7)]
    queue.replace(ticks, 64, 0.0)
    [lead] = queue.take(1, {}, 0, 1.0)
    assert lead.planned_ns == 0
    odd = queue.take_like(lead, 8, 1.0, lambda t: t.planned_ns % 2 == 1)
    assert [t.planned_ns for t in odd] == [1, 3, 5]  # due and fitting; not the one due later, nor principal 2's
    rest = queue.take(8, {}, 0, 10.0)
    assert sorted(t.planned_ns for t in rest) == [2, 4, 6, 7]


def test_a_batch_takes_at_most_its_limit_and_nothing_from_an_empty_queue() -> None:
    queue = TickQueue()
    queue.replace([_tick(1, 0.0, n) for n in range(10)], 64, 0.0)
    [lead] = queue.take(1, {}, 0, 1.0)
    assert len(queue.take_like(lead, 3, 1.0, lambda t: True)) == 3
    assert len(queue) == 6
    assert queue.take_like(_tick(9, 0.0, 99), 8, 1.0, lambda t: True) == []


def test_the_queue_counts_a_principals_due_ticks() -> None:
    queue = TickQueue()
    queue.replace([_tick(1, 0.0, n) for n in range(5)] + [_tick(1, 5.0, 5), _tick(2, 0.0, 6)], 64, 0.0)
    assert queue.due(1, 1.0) == 5
    assert queue.due(1, 5.0) == 6
    assert queue.due(2, 1.0) == 1
    assert queue.due(3, 1.0) == 0


def test_a_batch_holds_what_fits_its_budget_at_the_last_duration() -> None:
    durations = Durations()
    assert durations.batch_size("a()") == 0  # not known: no batch
    durations.note("a()", BATCH_TICK_MS)
    assert durations.batch_size("a()") == int(BATCH_BUDGET_MS / BATCH_TICK_MS)
    durations.note("a()", 0.0)
    assert durations.batch_size("a()") > 1000
    durations.note("a()", BATCH_TICK_MS + 1)
    assert durations.batch_size("a()") == 0


def test_durations_say_short_only_for_a_known_procedure_under_the_limit() -> None:
    durations = Durations(limit=2)
    assert not durations.short("a()")
    durations.note("a()", BATCH_TICK_MS)
    durations.note("b()", BATCH_TICK_MS + 1)
    assert durations.short("a()")
    assert not durations.short("b()")
    durations.note("c()", 1.0)  # the least recently noted is forgotten
    assert not durations.short("a()")
    assert durations.short("c()")


@pytest.mark.parametrize(("due_in", "sleep"), [(1.0, 1.0 - FIND_AHEAD_S), (FIND_AHEAD_S + 0.005, 0.005),
                                               (FIND_AHEAD_S, FIND_AHEAD_S), (0.005, 0.005), (0.0, 0.0)])
def test_a_node_wakes_to_find_the_next_tick_ahead_once_then_at_its_time(due_in: float, sleep: float) -> None:
    """Before a tick due in more than FIND_AHEAD_S the node wakes that much early, and a find then sees it
    (FIND_AHEAD_S is inside the finder's horizon); within it, it sleeps until the tick is due, and a tick due
    now means no sleep: the early wake happens once, never as a loop of sleeps of 0."""
    assert FIND_AHEAD_S * 1000 < HORIZON_MS
    assert wake_in(due_in) == pytest.approx(sleep)


LONG = 7 * 86_400_000  # WITH (timeout = '7 days')


def test_long_ticks_start_only_while_long_slots_are_free_and_a_principal_then_gets_its_short_one() -> None:
    queue = TickQueue(Reserve(long_ms=300_000, long_cap=3))
    queue.replace([_tick(1, 0.0, 0, LONG), _tick(1, 0.0, 1, LONG), _tick(1, 0.0, 2), _tick(2, 0.0, 3, LONG)], 64, 0.0)
    taken = queue.take(4, {}, 0, 1.0, long_free=1)
    assert sorted(t.planned_ns for t in taken) == [0, 2]  # one long one, then principal 1's short one
    assert queue.next_due_in({}, 0, 1.0, long_free=0) is None  # the rest are long: they wait for a long slot
    assert queue.next_due_in({}, 0, 1.0, long_free=1) == 0.0
    assert sorted(t.planned_ns for t in queue.take(4, {}, 0, 1.0, long_free=None)) == [1, 3]  # None: no limit


def test_ties_go_to_the_principal_served_least_recently() -> None:
    served = Served()
    queue = TickQueue(served=served)
    queue.replace([_tick(1, 0.0, 0), _tick(2, 5.0, 1)], 64, 0.0)
    served.note(1)  # 1's tick is older, but 1 was served and 2 never was
    assert [t.principal for t in queue.take(1, {}, 0, 10.0)] == [2]
    assert served.oldest_first() == [1, 2]
    queue.replace([_tick(1, 0.0, 2), _tick(2, 0.0, 3)], 64, 0.0)
    assert [t.principal for t in queue.take(1, {}, 0, 10.0)] == [1]  # now 1 waited longer
    assert [t.principal for t in queue.take(1, {1: 1}, 0, 10.0)] == [2]  # fewer running comes first


def test_a_principal_forgotten_by_the_served_memory_counts_as_never_served() -> None:
    served = Served(limit=2)
    for principal in (1, 2, 3):
        served.note(principal)
    assert served.oldest_first() == [2, 3]
    assert served.rank(1) == 0 < served.rank(2) < served.rank(3)
