"""The hard quota in front of a queue's claims: one unit per task, taken by the claim itself.

The scheduler's claims carry the quota (`Claim.quota`), so units are spent only for tasks
claimed, in the same atomic step. Exhausted (no unit left) is not an error: the queue
pauses until the window ends. A broker error is: the gate fails closed (claims nothing),
backs off and shows ``quota_stalled`` until the medium answers again -- it never falls back
to counting locally.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from taskgate.brokers.base import QuotaSpec
from taskgate.brokers.params import Claimed

__all__ = ["QuotaGate"]


class QuotaGate:
    """One queue's view of its quota budget (`spec`)."""

    def __init__(self, *, key: str, limit: int, period: timedelta, recheck: float) -> None:
        self.spec = QuotaSpec(key=key, limit=limit, period=period)
        self._recheck = recheck
        self.exhausted = False
        self.stalled = False
        self.pause = 0.0

    def took(self, claim: Claimed) -> None:
        """Note what a claim carrying this quota answered. Sets `exhausted` and `pause`."""
        self.stalled = False
        self.exhausted = claim.exhausted
        if claim.exhausted and claim.quota is not None:
            self.pause = self._until(claim.quota.window_end)

    def unreachable(self) -> None:
        """The claim could not reach the medium: nothing was granted (fail closed) -- shown as
        ``quota_stalled`` until a claim gets an answer again (the scheduler backs off)."""
        self.stalled = True

    def _until(self, window_end: datetime) -> float:
        # The window ends on the medium's clock, which may not be ours (or may be a test's
        # manual clock): wait until it ends by our clock, but re-ask at least every `recheck`.
        remaining = (window_end - datetime.now(UTC)).total_seconds()
        return min(max(remaining, 0.05), self._recheck)
