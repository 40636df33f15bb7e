"""A token bucket for handler starts: ``rps`` tokens per second, at most ``burst`` saved up.

Time comes from the caller (``anyio.current_time()``, monotonic), so the bucket is pure and a
unit test can drive it with plain numbers.
"""

from __future__ import annotations

import math

__all__ = ["TokenBucket"]


class TokenBucket:
    """Starts allowed per second. ``rps=0`` means unlimited (every check grants all asked)."""

    def __init__(self, rps: float, burst: int, now: float) -> None:
        if rps < 0 or burst < 0:
            raise ValueError(f"rps and burst must be >= 0, got rps={rps!r} burst={burst!r}")
        self.rps = float(rps)
        self.capacity = float(burst or max(1, int(rps)))
        self._tokens = self.capacity
        self._stamp = now

    @property
    def unlimited(self) -> bool:
        """True when no rate applies."""
        return self.rps == 0

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._stamp)
        self._tokens = min(self.capacity, self._tokens + elapsed * self.rps)
        self._stamp = max(self._stamp, now)

    def available(self, now: float, want: int) -> int:
        """How many of ``want`` starts may happen now (whole tokens only); takes nothing."""
        if self.unlimited:
            return want
        self._refill(now)
        return max(0, min(want, math.floor(self._tokens + 1e-9)))

    def take(self, now: float, n: int) -> None:
        """Spend ``n`` tokens (after the starts happened; never below zero)."""
        if self.unlimited or n <= 0:
            return
        self._refill(now)
        self._tokens = max(0.0, self._tokens - n)

    def wait_time(self, now: float) -> float:
        """Seconds until at least one whole token is available (0 when one is)."""
        if self.unlimited:
            return 0.0
        self._refill(now)
        missing = 1.0 - self._tokens
        return 0.0 if missing <= 1e-9 else missing / self.rps
