"""The hard quota in front of a queue's claims: reserve before claiming, give back what was unused.

Exhausted (a grant of 0) is not an error: the queue pauses until the window ends. A broker
error is: the gate fails closed (grants nothing), backs off exponentially and shows
``quota_stalled`` until the medium answers again -- it never falls back to counting locally.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from taskgate.brokers.base import Broker, QuotaGrant
from taskgate.errors import BrokerError
from taskgate.runtime.backoff import exponential
from taskgate.runtime.calls import BrokerCalls

__all__ = ["QuotaGate"]

log = logging.getLogger("taskgate")


class QuotaGate:
    """One queue's view of its quota budget (``key``/``limit``/``period``)."""

    def __init__(
        self,
        broker: Broker,
        calls: BrokerCalls,
        *,
        key: str,
        limit: int,
        period: timedelta,
        deadline: float,
        recheck: float,
    ) -> None:
        self._broker, self._calls = broker, calls
        self.key, self.limit, self.period = key, limit, period
        self._deadline, self._recheck = deadline, recheck
        self.exhausted = False
        self.stalled = False
        self._failures = 0
        self.pause = 0.0

    async def reserve(self, n: int) -> QuotaGrant | None:
        """Take up to ``n`` units; None (and `pause` seconds to wait) when nothing was granted."""
        try:
            grant = await self._calls(
                self._broker.reserve_quota, self.key, self.limit, self.period, n, deadline=self._deadline
            )
        except BrokerError as exc:
            self._stall(exc)
            return None
        self.stalled, self._failures = False, 0
        if grant.granted <= 0:
            self.exhausted = True
            self.pause = self._until(grant.window_end)
            return None
        self.exhausted = False
        return grant

    async def release(self, grant: QuotaGrant, unused: int) -> None:
        """Give back ``unused`` units of ``grant`` (a failure here only makes fewer starts)."""
        if unused <= 0:
            return
        try:
            await self._calls(self._broker.release_quota, grant, unused, deadline=self._deadline)
        except BrokerError as exc:
            log.warning("quota %r: could not give back %d unit(s): %s", self.key, unused, exc)

    def _stall(self, exc: BrokerError) -> None:
        self._failures += 1
        self.stalled = True
        self.pause = exponential(self._failures, base=self._recheck / 4, cap=30.0)
        log.warning("quota %r unreachable (fail closed, retry in %.2fs): %s", self.key, self.pause, exc)

    def _until(self, window_end: datetime) -> float:
        # The window ends on the medium's clock, which may not be ours (or may be a test's
        # manual clock): wait until it ends by our clock, but re-ask at least every `recheck`.
        remaining = (window_end - datetime.now(UTC)).total_seconds()
        return min(max(remaining, 0.05), self._recheck)
