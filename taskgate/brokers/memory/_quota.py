"""Quota windows of the memory broker, counted in process memory."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from taskgate.brokers.base import QuotaGrant, QuotaSpec
from taskgate.brokers.params import QuotaUsage

__all__ = ["QuotaBook", "window_bounds"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def window_bounds(now: datetime, period: timedelta) -> tuple[datetime, datetime]:
    """The epoch-aligned window of ``period`` containing ``now``: ``[start, end)``.

    Integer microseconds, so the boundary is exact (a 24 h window starts at 00:00 UTC).
    """
    period_us = period // _MICROSECOND
    start_us = (now - _EPOCH) // _MICROSECOND // period_us * period_us
    start = _EPOCH + timedelta(microseconds=start_us)
    return start, start + period


class QuotaBook:
    """Units used per ``(key, window_start)``; only the newest window of a key is kept."""

    def __init__(self) -> None:
        self._used: dict[tuple[str, datetime], int] = {}
        self._newest: dict[str, datetime] = {}

    def reserve(self, key: str, limit: int, period: timedelta, n: int, now: datetime) -> QuotaGrant:
        """Take up to ``n`` units of the window containing ``now``; never past ``limit``."""
        start, end = window_bounds(now, period)
        newest = self._newest.get(key)
        if newest is not None and start < newest:
            # The clock stepped back into a window we already forgot: its count is unknown,
            # so grant nothing rather than risk issuing more than the limit.
            return QuotaGrant(key=key, window_start=start, window_end=end, granted=0, limit=limit)
        if newest is not None and start > newest:
            del self._used[(key, newest)]
        self._newest[key] = start
        used = self._used.get((key, start), 0)
        granted = max(0, min(n, limit - used))
        self._used[(key, start)] = used + granted
        return QuotaGrant(key=key, window_start=start, window_end=end, granted=granted, limit=limit)

    def usage(self, spec: QuotaSpec, now: datetime) -> QuotaUsage:
        """The figures of ``spec``'s window containing ``now``, as `reserve` would find it."""
        start, end = window_bounds(now, spec.period)
        newest = self._newest.get(spec.key)
        if newest is not None and start < newest:
            used = spec.limit  # a forgotten window: `reserve` grants nothing from it
        else:
            used = min(self._used.get((spec.key, start), 0), spec.limit)
        return QuotaUsage(key=spec.key, limit=spec.limit, used=used, window_start=start, window_end=end)

    def release(self, grant: QuotaGrant, n: int) -> None:
        """Return ``n`` units to the grant's window, if it is still kept (never below 0)."""
        slot = (grant.key, grant.window_start)
        used = self._used.get(slot)
        if used is not None:
            self._used[slot] = max(0, used - n)
