"""Concurrency slots and start rate of one queue: local to this process, or global via the broker.

`LocalLimits` counts slots in memory and meters starts with a `TokenBucket`;
`DistributedLimits` asks the broker's `DistributedLimiter` (Redis) so the limits hold across
every process. Both speak the same small interface, so the scheduler never asks which.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Protocol

import anyio

from taskgate.brokers.base import DistributedLimiter, LimitedClaim, QuotaSpec
from taskgate.config import QueueConfig
from taskgate.errors import BrokerError
from taskgate.runtime.bucket import TokenBucket
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.group import GroupCall

__all__ = ["DistributedLimits", "Limits", "LocalLimits"]

log = logging.getLogger("taskgate")

Slot = str | None
# ``(queue, capacity, n, lease_ttl, quota) -> LimitedClaim``: see `Limits.combined_claim`.
CombinedClaim = Callable[[str, int, int, timedelta, QuotaSpec | None], LimitedClaim]


class Limits(Protocol):
    """Slots and rate for one queue's scheduler."""

    @property
    def combined_claim(self) -> CombinedClaim | None:
        """A broker call taking slots and claiming in one step, when nothing must come between.

        Called as ``combined_claim(queue, capacity, n, lease_ttl, quota)``: slots, rate and the
        quota (when given) in the claim itself; each lease's token is then its slot. None:
        take slots and rate first, then claim.
        """
        ...

    async def settle_releases(self) -> None:
        """Return once slots being given back have landed (so a claim counts them free)."""
        ...

    async def take_slots(self, n: int) -> list[Slot]:
        """Up to ``n`` concurrency slots (the caller already capped ``n`` by local free workers)."""
        ...

    async def take_rate(self, n: int) -> tuple[int, float]:
        """Up to ``n`` starts allowed now, and the wait before the next one when fewer."""
        ...

    def spent(self, granted: int, used: int) -> None:
        """``used`` of ``granted`` starts happened (a local bucket pays only for these)."""
        ...

    async def renew(self, slots: Sequence[Slot]) -> list[Slot]:
        """Keep ``slots`` alive; returns those that were lost."""
        ...

    async def release(self, slots: Sequence[Slot]) -> None:
        """Give ``slots`` back (each at most once)."""
        ...


class LocalLimits:
    """Per-process limits: the local worker count is the slot count, the bucket meters starts."""

    def __init__(self, conf: QueueConfig) -> None:
        self._bucket = TokenBucket(conf.rps, conf.burst, anyio.current_time())

    @property
    def combined_claim(self) -> CombinedClaim | None:
        """Local slots cost no call: nothing to combine."""
        return None

    async def settle_releases(self) -> None:
        """Local slots are given back at once."""

    async def take_slots(self, n: int) -> list[Slot]:
        """Local slots are the scheduler's free workers: all ``n`` are granted."""
        return [None] * n

    async def take_rate(self, n: int) -> tuple[int, float]:
        """Whole tokens available now (taking none yet), and the wait for the next token."""
        now = anyio.current_time()
        granted = self._bucket.available(now, n)
        return granted, (0.0 if granted else self._bucket.wait_time(now))

    def spent(self, granted: int, used: int) -> None:
        """Pay for the ``used`` starts."""
        self._bucket.take(anyio.current_time(), used)

    async def renew(self, slots: Sequence[Slot]) -> list[Slot]:
        """Local slots cannot be lost."""
        return []

    async def release(self, slots: Sequence[Slot]) -> None:
        """Nothing to give back: the scheduler's running count is the slot count."""


class DistributedLimits:
    """Global limits through the broker's `DistributedLimiter`; slots expire with the lease."""

    def __init__(
        self, limiter: DistributedLimiter, calls: BrokerCalls, queue: str, conf: QueueConfig, deadline: float
    ) -> None:
        self._limiter, self._calls, self._queue, self._conf = limiter, calls, queue, conf
        self._deadline = deadline
        # Handlers finishing together give their slots back in one call, not one each.
        self._releases: GroupCall[list[str], None] = GroupCall(self._release_many, max_batch=256)

    @property
    def _ttl(self) -> timedelta:
        return self._conf.lease

    @property
    def combined_claim(self) -> CombinedClaim | None:
        """Slots, the global rate and the claim in one script: spent only for tasks claimed."""
        return self._claim

    def _claim(
        self, queue: str, capacity: int, n: int, lease_ttl: timedelta, quota: QuotaSpec | None
    ) -> LimitedClaim:
        conf = self._conf
        return self._limiter.claim_with_limits(
            queue, capacity, n, lease_ttl, rps=conf.rps, burst=conf.effective_burst, quota=quota
        )

    async def settle_releases(self) -> None:
        """Slots being given back right now would be refused to us: let that land first."""
        await self._releases.settled()

    async def take_slots(self, n: int) -> list[Slot]:
        """Up to ``n`` of the queue's global ``workers`` slots (none when the broker fails)."""
        await self.settle_releases()
        try:
            tokens = await self._calls(
                self._limiter.acquire_slots,
                self._queue,
                self._conf.workers,
                n,
                self._ttl,
                deadline=self._deadline,
            )
        except BrokerError as exc:
            log.warning("queue %r: cannot take concurrency slots: %s", self._queue, exc)
            return []
        return list(tokens)

    async def take_rate(self, n: int) -> tuple[int, float]:
        """Starts from the broker's GCRA limiter (spent as soon as granted)."""
        if self._conf.rps == 0:
            return n, 0.0
        try:
            return await self._calls(
                self._limiter.take_rate,
                self._queue,
                self._conf.rps,
                self._conf.effective_burst,
                n,
                deadline=self._deadline,
            )
        except BrokerError as exc:
            log.warning("queue %r: rate limiter unreachable: %s", self._queue, exc)
            return 0, 1.0

    def spent(self, granted: int, used: int) -> None:
        """Global starts were spent when granted; unused ones are lost (fewer starts, never more)."""

    async def renew(self, slots: Sequence[Slot]) -> list[Slot]:
        """Extend held slots; returns those no longer held (a BrokerError propagates)."""
        tokens = [s for s in slots if s is not None]
        if not tokens:
            return []
        lost = await self._calls(
            self._limiter.renew_slots, self._queue, tokens, self._ttl, deadline=self._deadline
        )
        return list(lost)

    async def release(self, slots: Sequence[Slot]) -> None:
        """Give slots back (grouped with other releases); failures only delay them until they expire."""
        tokens = [s for s in slots if s is not None]
        if tokens:
            await self._releases(tokens)

    async def _release_many(self, groups: list[list[str]]) -> list[None]:
        tokens = [token for group in groups for token in group]
        try:
            await self._calls(self._limiter.release_slots, self._queue, tokens, deadline=self._deadline)
        except BrokerError as exc:
            log.warning("queue %r: could not release %d slot(s): %s", self._queue, len(tokens), exc)
        return [None] * len(groups)
