"""Clocks: the system clock, and a manual one that tests move by hand instead of sleeping."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock", "utc"]


def utc(value: datetime) -> datetime:
    """Return ``value`` as an aware UTC datetime; naive values are taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class Clock(Protocol):
    """Something that tells the current time as an aware UTC datetime."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...


class SystemClock:
    """The process's wall clock."""

    def now(self) -> datetime:
        """The current wall-clock time, UTC."""
        return datetime.now(UTC)


class ManualClock:
    """A clock that only moves when told to; thread-safe. Used by tests instead of sleeps."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = utc(start) if start is not None else datetime(2030, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """The time the clock was last set or advanced to."""
        with self._lock:
            return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        """Move forward by ``delta`` (a timedelta or seconds) and return the new time."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError(f"a clock cannot go back: advance({delta!r})")
        with self._lock:
            self._now += step
            return self._now

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (never backwards)."""
        when = utc(when)
        with self._lock:
            if when < self._now:
                raise ValueError(f"a clock cannot go back: {when.isoformat()} < {self._now.isoformat()}")
            self._now = when
