"""The database server's clock without a round trip per transaction.

Every transition needs "now" on the server's clock (leases expire and quota windows turn on
it, for every process alike). Reading it costs a round trip per transaction; instead the
server is read once every `RESYNC_SECONDS` and carried forward on this host's monotonic clock.
The error is at most the sampling round trip (well under a millisecond on a LAN) plus the
drift of two quartz clocks over a few seconds -- nothing next to lease TTLs and quota
windows -- and time a process reports never runs backwards.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from sqlalchemy import Connection

from taskgate.brokers.sql.dialects import Traits

__all__ = ["RESYNC_SECONDS", "SampledServerClock"]

# How long one reading of the server's clock is carried forward before the next one.
RESYNC_SECONDS = 5.0


class SampledServerClock:
    """``now(conn)``: the server's time, read through ``conn`` at most every ``resync`` seconds."""

    def __init__(self, traits: Traits, *, resync: float = RESYNC_SECONDS) -> None:
        self._traits = traits
        self._resync = resync
        self._lock = threading.Lock()
        self._base: tuple[datetime, float] | None = None  # (server time, monotonic) of a reading
        self._last: datetime | None = None

    def now(self, conn: Connection) -> datetime:
        """The server's current time, aware UTC; never earlier than a time given out before."""
        base = self._base
        if base is None or time.monotonic() - base[1] >= self._resync:
            before = time.monotonic()
            server = self._traits.server_now(conn)
            # The server read its clock somewhere inside the round trip: take the middle.
            base = (server, (before + time.monotonic()) / 2)
            self._base = base
        return self._carried(base)

    def after_fork_in_child(self) -> None:
        """A fresh lock for a forked child (a thread of the parent may have held this one)."""
        self._lock = threading.Lock()

    def now_if_fresh(self) -> datetime | None:
        """`now` for a caller that cannot wait for the server: None when a reading is due."""
        base = self._base
        if base is None or time.monotonic() - base[1] >= self._resync:
            return None
        return self._carried(base)

    def _carried(self, base: tuple[datetime, float]) -> datetime:
        value = base[0] + timedelta(seconds=time.monotonic() - base[1])
        with self._lock:
            if self._last is not None and value < self._last:
                value = self._last  # a new reading slightly behind the carried-forward one
            self._last = value
        return value
