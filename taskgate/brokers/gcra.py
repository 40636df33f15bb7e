"""A start rate as a generic cell rate algorithm (GCRA), for the rates claims share in the store.

The state is one stored time, the theoretical arrival time ``tat``: a start is allowed while it
is at most ``burst`` intervals ahead of now, and each start moves it on by one interval. A
queue's rate and each group's keep theirs where the broker keeps its shared limits: the SQL
broker in a ``<prefix>queue_limits`` row (`taskgate.brokers.sql.slots`,
`taskgate.brokers.sql.groups`), the memory broker in memory (`taskgate.brokers.memory._limits`);
the Redis broker's Lua scripts apply the same rule (``gcra_take`` in ``_lib.lua``).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

__all__ = ["Gcra"]

# Rate arithmetic is in whole microseconds; a start is allowed this much before it is due so
# that a time rounded to the microsecond never withholds one.
_ROUNDING = 1e-6


class Gcra:
    """One rate of ``rps`` starts a second with bursts of ``burst`` (0 means 1), as its stored
    arrival time (None: never used) leaves it at ``now``."""

    def __init__(self, rps: float, burst: int, stored: datetime | None, now: datetime) -> None:
        self._interval = 1.0 / rps
        self._burst = max(burst, 1)
        self._now = now
        # Seconds the arrival time is ahead of now (never behind: idle time earns no extra burst).
        self._ahead = max(0.0, (stored - now).total_seconds()) if stored is not None else 0.0
        self.changed = False

    def room(self) -> int:
        """Starts allowed now."""
        return max(0, math.floor((self._burst * self._interval - self._ahead) / self._interval + _ROUNDING))

    def spend(self, starts: int) -> None:
        """Move the arrival time on by ``starts``."""
        if starts > 0:
            self._ahead += starts * self._interval
            self.changed = True

    def wait(self) -> float:
        """Seconds until the next start is allowed, rounded up to the microsecond."""
        seconds = max(0.0, self._ahead - (self._burst - 1) * self._interval)
        return math.ceil(seconds * 1_000_000 - _ROUNDING) / 1_000_000

    @property
    def tat(self) -> datetime:
        """The arrival time to store."""
        return self._now + timedelta(microseconds=round(self._ahead * 1_000_000))
