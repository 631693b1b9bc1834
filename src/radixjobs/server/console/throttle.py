"""Backoff of console logins: per client address and per principal (a role, or the token), pure policy.

Invariants:
- An attempt is keyed by its client (an IPv4 address, an IPv6 /64) and by what it tries to log in as (the
  role in postgres mode, the token in token mode). It goes on only when none of its keys is waiting out a
  backoff or has another attempt in flight; else it is refused with the seconds to wait, and checks nothing.
- Only failures count, and they count for every key of the attempt: a key's first ``FREE_FAILURES`` are free,
  after that each failure makes the next attempt wait ``BASE_DELAY_S`` doubled per failure, at most
  ``MAX_DELAY_S``. A success neither adds nor clears (so an attacker's own valid login does not reset the
  count it built against another role). A key is forgotten ``FORGET_S`` after its last failure.
- One attempt in flight per key: parallel guesses cannot all pass before the first one's failure is counted.
- Memory is bounded: at most ``max_keys`` keys (and those of the attempts in flight, bounded by the HTTP
  connection cap). A new key in a full table first drops the forgotten ones,
  then the tenth with the fewest failures (oldest first), never a key with an attempt in flight: a flood of
  fresh keys evicts fresh keys, not the count built against the role under attack.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

FREE_FAILURES = 5
BASE_DELAY_S = 1.0
MAX_DELAY_S = 60.0
FORGET_S = 15 * 60.0
MAX_KEYS = 10_000
IN_FLIGHT_WAIT_S = 1.0  # what a refused parallel attempt is told to wait


def client_key(address: str | None) -> str:
    """The throttle key of a client address: the address (IPv4, or IPv4-mapped), an IPv6 /64."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return f"client:{address or '?'}"[:80]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is None:
            return f"client:{ipaddress.IPv6Network((ip, 64), strict=False)}"
        ip = ip.ipv4_mapped
    return f"client:{ip}"


def delay_after(failures: int) -> float:
    """How long the next attempt waits after ``failures`` failures."""
    if failures < FREE_FAILURES:
        return 0.0
    return min(MAX_DELAY_S, BASE_DELAY_S * 2.0 ** min(failures - FREE_FAILURES, 32))


@dataclass
class Entry:
    failures: int = 0
    last_failure: float = 0.0
    in_flight: bool = False
    refusals: int = 0  # attempts refused since the last failure


class LoginThrottle:
    def __init__(self, clock: Callable[[], float] = time.monotonic, max_keys: int = MAX_KEYS):
        self.clock = clock
        self.max_keys = max_keys
        self.entries: dict[str, Entry] = {}

    def begin(self, keys: Sequence[str]) -> float:
        """0.0: the attempt may go on (its keys are in flight until ``end``); else the seconds to wait."""
        now = self.clock()
        waits = {key: self._wait(key, now) for key in keys}
        wait = max(waits.values(), default=0.0)
        if wait > 0:
            for key in (k for k, w in waits.items() if w > 0):
                self.entries[key].refusals += 1
            return wait
        missing = [key for key in keys if key not in self.entries]
        for key in keys:
            if key in self.entries:
                self.entries[key].in_flight = True  # first: making room never evicts a key in flight
        for key in missing:
            self._make_room(now)
            self.entries[key] = Entry(in_flight=True)
        return 0.0

    def end(self, keys: Sequence[str], *, failed: bool) -> float:
        """The attempt begun with ``keys`` is over; returns the wait it imposes on the next one."""
        now = self.clock()
        wait = 0.0
        for key in keys:
            entry = self.entries.get(key)
            if entry is None:
                continue
            entry.in_flight = False
            if failed:
                entry.failures += 1
                entry.last_failure = now
                entry.refusals = 0
                wait = max(wait, delay_after(entry.failures))
            elif entry.failures == 0:
                del self.entries[key]
        return wait

    def failures(self, key: str) -> int:
        entry = self.entries.get(key)
        return entry.failures if entry is not None else 0

    def first_refusal(self, keys: Sequence[str]) -> bool:
        """Was the attempt just refused the first one refused since a key's last failure (to log once)?"""
        return any(e.refusals == 1 for e in (self.entries.get(k) for k in keys) if e is not None)

    def _wait(self, key: str, now: float) -> float:
        entry = self.entries.get(key)
        if entry is None:
            return 0.0
        if entry.in_flight:
            return IN_FLIGHT_WAIT_S
        if self._forgotten(entry, now):
            del self.entries[key]
            return 0.0
        return max(0.0, entry.last_failure + delay_after(entry.failures) - now)

    @staticmethod
    def _forgotten(entry: Entry, now: float) -> bool:
        return not entry.in_flight and now - entry.last_failure > FORGET_S

    def _make_room(self, now: float) -> None:
        if len(self.entries) < self.max_keys:
            return
        for key in [k for k, e in self.entries.items() if self._forgotten(e, now)]:
            del self.entries[key]
        if len(self.entries) < self.max_keys:
            return
        idle = sorted((e.failures, e.last_failure, k) for k, e in self.entries.items() if not e.in_flight)
        for _, _, key in idle[:max(1, self.max_keys // 10)]:
            del self.entries[key]


def retry_after(wait_s: float) -> str:
    """The ``Retry-After`` value for a wait: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))
