"""Quota windows, concurrency slots and GCRA rate in Redis, shared by every process.

Each operation is one Lua script on the broker's clock (server ``TIME`` unless a clock was
injected), so check-and-take is atomic across processes. When Redis cannot be reached the
scripts raise `BrokerError`: nothing is ever granted without the server (fail closed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from taskgate.brokers.base import QuotaGrant, check_identifier
from taskgate.brokers.checks import check_count, check_duration, check_quota_release, check_quota_request
from taskgate.brokers.redis.codec import from_us, to_us, ttl_us
from taskgate.brokers.redis.keys import KeySpace
from taskgate.brokers.redis.scripts import redis_errors
from taskgate.ids import new_tokens

__all__ = ["RedisLimits", "check_rate", "check_tokens"]

Runner = Callable[[str, Sequence[Any]], list[Any]]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_tokens(tokens: object) -> list[str]:
    """Slot tokens as a list, each a usable identifier; a bare str is refused."""
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise TypeError(f"tokens must be a sequence of slot tokens, got {tokens!r}")
    return [check_identifier(t, what="slot token") for t in tokens]


def check_rate(rps: object, burst: object) -> tuple[float, int]:
    """``(rps, burst)`` as the scripts take them: ``burst=0`` means ``max(1, int(rps))``."""
    if isinstance(rps, bool) or not isinstance(rps, int | float) or not math.isfinite(rps) or rps < 0:
        raise ValueError(f"rps must be a finite number >= 0, got {rps!r}")
    size = check_count(burst, what="burst", minimum=0)
    return float(rps), size or max(1, int(rps))


class RedisLimits:
    """The quota and `DistributedLimiter` half of `RedisBroker`; ``run`` calls a script."""

    def __init__(self, run: Runner, client: Any, keys: KeySpace) -> None:
        self._run = run
        self._client = client
        self._keys = keys

    # -- quota -----------------------------------------------------------------------------

    def reserve_quota(self, key: str, limit: int, period: timedelta, n: int = 1) -> QuotaGrant:
        """Take up to ``n`` units of the epoch-aligned window of ``period`` holding "now"."""
        check_quota_request(key, limit, period, n)
        start_us, granted = self._run("quota_reserve", [key, limit, ttl_us(period), n])
        start = from_us(start_us)
        end = start + period
        return QuotaGrant(key=key, window_start=start, window_end=end, granted=int(granted), limit=limit)

    def release_quota(self, grant: QuotaGrant, n: int) -> None:
        """Give ``n`` (0 … ``grant.granted``) units back to the grant's window, never below 0."""
        check_quota_release(grant, n)
        if n:
            self._run("quota_release", [grant.key, to_us(grant.window_start), n])

    # -- concurrency slots -----------------------------------------------------------------

    def acquire_slots(self, queue: str, capacity: int, n: int, ttl: timedelta) -> list[str]:
        """Take up to ``n`` of ``queue``'s ``capacity`` slots, each expiring ``ttl`` after now."""
        check_identifier(queue, what="queue")
        check_count(capacity, what="slot capacity", minimum=1)
        check_count(n, what="slots wanted n", minimum=0)
        check_duration(ttl, what="slot ttl", positive=True)
        if n == 0:
            return []
        tokens = new_tokens(n)
        return [_text(t) for t in self._run("slots_acquire", [queue, capacity, ttl_us(ttl), *tokens])]

    def renew_slots(self, queue: str, tokens: Sequence[str], ttl: timedelta) -> list[str]:
        """Extend held slots to now + ``ttl``; return the tokens that were no longer held."""
        check_identifier(queue, what="queue")
        held = check_tokens(tokens)
        check_duration(ttl, what="slot ttl", positive=True)
        if not held:
            return []
        return [_text(t) for t in self._run("slots_renew", [queue, ttl_us(ttl), *held])]

    def release_slots(self, queue: str, tokens: Sequence[str]) -> None:
        """Give slots back; ``ZREM`` of a token not held does nothing, so at most once."""
        check_identifier(queue, what="queue")
        held = check_tokens(tokens)
        if held:
            with redis_errors("release_slots"):
                self._client.zrem(self._keys.slots(queue), *held)

    # -- rate ------------------------------------------------------------------------------

    def take_rate(self, queue: str, rps: float, burst: int, n: int) -> tuple[int, float]:
        """Take up to ``n`` starts from ``queue``'s GCRA limiter: ``(granted, retry_after_s)``.

        ``rps=0`` means unlimited; ``burst=0`` means ``max(1, int(rps))``.
        """
        check_identifier(queue, what="queue")
        rate, size = check_rate(rps, burst)
        check_count(n, what="starts wanted n", minimum=0)
        if rate == 0 or n == 0:
            return n, 0.0
        granted, retry_after = self._run("rate_take", [queue, repr(rate), size, n])
        return int(granted), float(retry_after)
