"""Wall-clock times of an IANA zone and the UTC instants they occur at — pure, whole seconds.

A naive local time occurs at no instant (a spring-forward gap), at one, or at two (a fall-back fold: first
the earlier offset's, then the later one's). Instants are ``int`` seconds since the Unix epoch (UTC).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

# Offset changes are looked for this far either side of an instant: DST shifts are under three hours
# (cronie likewise treats a larger change as a clock correction, not daylight saving time).
SHIFT_WINDOW_S = 3 * 3_600

_EPOCH = datetime(1970, 1, 1)


def local_time(instant_s: int, zone: ZoneInfo) -> datetime:
    """The naive wall-clock time in ``zone`` at ``instant_s``."""
    return datetime.fromtimestamp(instant_s, UTC).astimezone(zone).replace(tzinfo=None)


def _epoch_seconds(utc: datetime) -> int:
    delta = utc.replace(tzinfo=None) - _EPOCH
    return delta.days * 86_400 + delta.seconds


def occurrences(local: datetime, zone: ZoneInfo) -> tuple[int, ...]:
    """The instants at which the naive whole-second ``local`` occurs in ``zone``, earliest first: none in a
    gap, two in a fold."""
    found: list[int] = []
    for fold in (0, 1):
        instant = _epoch_seconds(local.replace(tzinfo=zone, fold=fold).astimezone(UTC))
        if instant not in found and local_time(instant, zone) == local:
            found.append(instant)
    return tuple(sorted(found))


def gap_end(local: datetime, zone: ZoneInfo) -> int:
    """The first instant after the jump over the gap that skips the naive ``local`` (which must be in one).

    Read with the later offset, ``local`` lies before the jump; with the earlier one, at or after it.
    """
    before = _epoch_seconds(local.replace(tzinfo=zone, fold=1).astimezone(UTC))
    after = _epoch_seconds(local.replace(tzinfo=zone, fold=0).astimezone(UTC))
    low, high = min(before, after), max(before, after)
    offset_after = _offset_s(high, zone)
    while high - low > 1:  # invariant: the offset at ``low`` is the old one, at ``high`` the new one
        middle = (low + high) // 2
        if _offset_s(middle, zone) == offset_after:
            high = middle
        else:
            low = middle
    return high


def shift_near(instant_s: int, zone: ZoneInfo) -> timedelta:
    """How far the zone's offset changes within ``SHIFT_WINDOW_S`` of ``instant_s`` (zero: no change)."""
    offsets = [_offset_s(instant_s + d, zone) for d in (-SHIFT_WINDOW_S, 0, SHIFT_WINDOW_S)]
    return timedelta(seconds=max(offsets) - min(offsets))


def _offset_s(instant_s: int, zone: ZoneInfo) -> int:
    offset = datetime.fromtimestamp(instant_s, UTC).astimezone(zone).utcoffset()
    return 0 if offset is None else int(offset.total_seconds())


__all__ = ["SHIFT_WINDOW_S", "gap_end", "local_time", "occurrences", "shift_near"]
