"""The console's login throttle (server/console/throttle.py): backoff, keys, memory, with a fake clock."""

from __future__ import annotations

import pytest

from radixjobs.server.console.throttle import (
    FORGET_S,
    FREE_FAILURES,
    IN_FLIGHT_WAIT_S,
    MAX_DELAY_S,
    LoginThrottle,
    client_key,
    delay_after,
    retry_after,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fail(throttle: LoginThrottle, keys: list[str]) -> float:
    assert throttle.begin(keys) == 0.0
    return throttle.end(keys, failed=True)


def test_the_backoff_doubles_after_the_free_failures_up_to_the_cap() -> None:
    assert [delay_after(n) for n in range(FREE_FAILURES)] == [0.0] * FREE_FAILURES
    assert [delay_after(FREE_FAILURES + i) for i in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert delay_after(10_000) == MAX_DELAY_S
    clock = Clock()
    throttle = LoginThrottle(clock)
    keys = ["client:127.0.0.21", "role:alice"]
    for _ in range(FREE_FAILURES - 1):
        assert _fail(throttle, keys) == 0.0
    assert _fail(throttle, keys) == 1.0
    assert throttle.begin(keys) == 1.0  # refused, nothing checked, nothing counted
    assert throttle.begin(["client:127.0.0.29", "role:alice"]) == 1.0  # the role, from another client
    assert throttle.begin(["client:127.0.0.21", "role:bob"]) == 1.0  # the client, for another role
    assert throttle.begin(["client:127.0.0.29", "role:bob"]) == 0.0
    throttle.end(["client:127.0.0.29", "role:bob"], failed=False)
    assert throttle.failures("role:alice") == FREE_FAILURES
    clock.now += 1.0
    assert _fail(throttle, keys) == 2.0
    assert retry_after(0.2) == "1"
    assert retry_after(throttle.begin(keys)) == "2"


def test_a_success_neither_adds_nor_clears() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(FREE_FAILURES + 1):
        clock.now += 60
        _fail(throttle, ["client:a", "role:alice"])
    clock.now += 60
    assert throttle.begin(["client:a", "role:mine"]) == 0.0
    throttle.end(["client:a", "role:mine"], failed=False)
    assert throttle.failures("role:alice") == FREE_FAILURES + 1
    assert throttle.failures("client:a") == FREE_FAILURES + 1
    assert "role:mine" not in throttle.entries


def test_one_attempt_in_flight_per_key() -> None:
    throttle = LoginThrottle(Clock())
    assert throttle.begin(["client:a", "role:alice"]) == 0.0
    assert throttle.begin(["client:b", "role:alice"]) == IN_FLIGHT_WAIT_S
    assert throttle.begin(["client:a", "role:bob"]) == IN_FLIGHT_WAIT_S
    throttle.end(["client:a", "role:alice"], failed=True)
    assert throttle.begin(["client:b", "role:alice"]) == 0.0


def test_failures_are_forgotten_after_a_quiet_period() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(FREE_FAILURES + 3):
        clock.now += MAX_DELAY_S
        _fail(throttle, ["client:a", "role:alice"])
    clock.now += FORGET_S + 1
    assert throttle.begin(["client:a", "role:alice"]) == 0.0
    assert throttle.failures("role:alice") == 0


def test_memory_is_bounded_and_a_flood_of_new_keys_keeps_the_count_under_attack() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock, max_keys=100)
    for _ in range(FREE_FAILURES + 2):
        clock.now += MAX_DELAY_S
        _fail(throttle, ["client:attacker", "role:alice"])
    in_flight = ["client:slow", "role:slow"]
    assert throttle.begin(in_flight) == 0.0
    for i in range(10_000):
        _fail(throttle, [f"client:{i}", f"role:r{i}"])
        assert len(throttle.entries) <= 100
    assert throttle.failures("role:alice") == FREE_FAILURES + 2
    assert throttle.failures("client:attacker") == FREE_FAILURES + 2
    assert throttle.entries["role:slow"].in_flight
    assert throttle.end(in_flight, failed=True) == 0.0
    assert throttle.failures("role:slow") == 1


@pytest.mark.parametrize(("address", "key"), [
    ("127.0.0.21", "client:127.0.0.21"), ("::ffff:127.0.0.21", "client:127.0.0.21"),
    ("::1", "client:::/64"), ("::1:0:0:9", "client:::/64"), ("0:0:0:1::1", "client:0:0:0:1::/64"),
    (None, "client:?"), ("not-an-address", "client:not-an-address"),
])
def test_client_keys(address: str | None, key: str) -> None:
    assert client_key(address) == key
