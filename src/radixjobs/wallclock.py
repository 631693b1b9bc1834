"""Wall-clock times of an IANA zone and the UTC instants they occur at — pure, whole seconds.

A naive local time occurs at no instant (a spring-forward gap), at one, or at two (a fall-back fold: first
the earlier offset's, then the later one's). Instants are ``int`` seconds since the Unix epoch (UTC).
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

# A fall-back is looked for this far ahead of an instant: DST shifts are under three hours (cronie likewise
# treats a larger change as a clock correction, not daylight saving time).
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
    return _change(min(before, after), max(before, after), zone)


def fall_back_ahead(instant_s: int, zone: ZoneInfo) -> int | None:
    """The instant within ``SHIFT_WINDOW_S`` after ``instant_s`` at which the wall clock goes back, if any."""
    horizon = instant_s + SHIFT_WINDOW_S
    if _offset_s(horizon, zone) >= _offset_s(instant_s, zone):
        return None
    return _change(instant_s, horizon, zone)


def _change(low: int, high: int, zone: ZoneInfo) -> int:
    """The first instant in (low, high] with the offset of ``high`` (one change between them)."""
    offset_after = _offset_s(high, zone)
    while high - low > 1:  # invariant: ``low`` has the old offset, ``high`` the new one
        middle = (low + high) // 2
        if _offset_s(middle, zone) == offset_after:
            high = middle
        else:
            low = middle
    return high


def _offset_s(instant_s: int, zone: ZoneInfo) -> int:
    offset = datetime.fromtimestamp(instant_s, UTC).astimezone(zone).utcoffset()
    return 0 if offset is None else int(offset.total_seconds())


__all__ = ["SHIFT_WINDOW_S", "fall_back_ahead", "gap_end", "local_time", "occurrences"]
