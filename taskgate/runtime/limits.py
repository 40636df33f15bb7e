"""Concurrency slots and start rate of one queue: local to this process, or global via the broker.

`LocalLimits` counts slots in memory and meters starts with a `TokenBucket`;
`DistributedLimits` asks the broker's `DistributedLimiter` (Redis) so the limits hold across
every process. Both speak the same small interface, so the scheduler never asks which.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

import anyio

from taskgate.brokers.base import (
    AckItem,
    DistributedLimiter,
    LimitedAckCarrier,
    LimitedClaim,
    QuietAckOutcome,
    QuotaSpec,
)
from taskgate.config import QueueConfig
from taskgate.errors import BrokerError
from taskgate.runtime.bucket import TokenBucket
from taskgate.runtime.calls import BrokerCalls

__all__ = ["DistributedLimits", "Limits", "LocalLimits"]

log = logging.getLogger("taskgate")

Slot = str | None


class CombinedClaim(Protocol):
    """See `Limits.combined_claim`."""

    def __call__(
        self,
        queue: str,
        capacity: int,
        n: int,
        lease_ttl: timedelta,
        /,
        *,
        quota: QuotaSpec | None,
        release: Sequence[str],
    ) -> LimitedClaim: ...


class CombinedAckClaim(Protocol):
    """See `Limits.combined_ack_claim`."""

    def __call__(
        self,
        acks: Sequence[AckItem],
        queue: str,
        capacity: int,
        n: int,
        lease_ttl: timedelta,
        /,
        *,
        quota: QuotaSpec | None,
        release: Sequence[str],
    ) -> tuple[list[QuietAckOutcome], LimitedClaim | None]: ...


class Limits(Protocol):
    """Slots and rate for one queue's scheduler."""

    @property
    def combined_claim(self) -> CombinedClaim | None:
        """A broker call taking slots and claiming in one step, when nothing must come between.

        Called as ``combined_claim(queue, capacity, n, lease_ttl, quota=…, release=…)``: slots,
        rate and the quota (when given) in the claim itself, after giving back the slots of
        ``release`` (`take_releases`); each lease's token is then its slot. None: take slots
        and rate first, then claim.
        """
        ...

    @property
    def combined_ack_claim(self) -> CombinedAckClaim | None:
        """`combined_claim` with quiet acks written before it, in one broker step.

        Called as ``combined_ack_claim(acks, queue, capacity, n, lease_ttl, quota=…, release=…)``;
        returns the acks' answers and the claim, or None for a claim that failed after the
        acks were written (`LimitedAckCarrier`). None: the acks are written on their own.
        """
        ...

    def give_back(self, slots: Sequence[Slot]) -> None:
        """Note ``slots`` as free; they go back with the next claim or `flush` (never waits)."""
        ...

    def take_releases(self) -> list[str]:
        """The slots noted by `give_back`, for a `combined_claim` to give back; now owned by it."""
        ...

    def restore_releases(self, tokens: Sequence[str]) -> None:
        """Slots a failed `combined_claim` may not have given back: keep them for the next try."""
        ...

    async def flush(self) -> None:
        """Give back the noted slots now (before the scheduler waits, and when it stops)."""
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

    @property
    def combined_ack_claim(self) -> CombinedAckClaim | None:
        """No combined claim: the acks ride on the broker's plain claim, if anywhere."""
        return None

    def give_back(self, slots: Sequence[Slot]) -> None:
        """Local slots are the scheduler's running count: nothing to note."""

    def take_releases(self) -> list[str]:
        """Nothing is ever noted."""
        return []

    def restore_releases(self, tokens: Sequence[str]) -> None:
        """Nothing is ever noted."""

    async def flush(self) -> None:
        """Nothing is ever noted."""

    async def take_slots(self, n: int) -> list[Slot]:
        """Local slots are the scheduler's free workers: all ``n`` are granted."""
        return [None] * n

    async def take_rate(self, n: int) -> tuple[int, float]:
        """Whole tokens available now (taking none yet), and the wait for the next token."""
        if self._bucket.unlimited:
            return n, 0.0  # no clock read: this runs before every claim
        now = anyio.current_time()
        granted = self._bucket.available(now, n)
        return granted, (0.0 if granted else self._bucket.wait_time(now))

    def spent(self, granted: int, used: int) -> None:
        """Pay for the ``used`` starts."""
        if not self._bucket.unlimited:
            self._bucket.take(anyio.current_time(), used)

    async def renew(self, slots: Sequence[Slot]) -> list[Slot]:
        """Local slots cannot be lost."""
        return []

    async def release(self, slots: Sequence[Slot]) -> None:
        """Nothing to give back: the scheduler's running count is the slot count."""


class DistributedLimits:
    """Global limits through the broker's `DistributedLimiter`; slots expire with the lease."""

    def __init__(
        self,
        limiter: DistributedLimiter,
        calls: BrokerCalls,
        queue: str,
        conf: QueueConfig,
        deadline: float,
        *,
        carrier: LimitedAckCarrier | None = None,
    ) -> None:
        """``carrier``: the same broker when its limited claims can carry acks."""
        self._limiter, self._calls, self._queue, self._conf = limiter, calls, queue, conf
        self._deadline = deadline
        # Slots of finished handlers, given back by the next claim's own script (no round trip
        # of their own) or by `flush` when no claim comes first. Held a little longer, a slot
        # only makes the queue run fewer tasks at once, never more.
        self._to_release: list[str] = []
        claimer = secrets.token_hex(8)  # this scheduler, in the broker's turn-taking
        # The broker's own methods with this queue's settings bound: a broker that splits its
        # calls (`taskgate.brokers.split`) recognises them under the partial.
        rps, burst = conf.rps, conf.effective_burst
        self._claim: CombinedClaim = functools.partial(
            limiter.claim_with_limits, rps=rps, burst=burst, claimer=claimer
        )
        self._ack_claim: CombinedAckClaim | None = None
        if carrier is not None:
            self._ack_claim = functools.partial(
                carrier.claim_with_limits_after_acks, rps=rps, burst=burst, claimer=claimer
            )

    @property
    def _ttl(self) -> timedelta:
        return self._conf.lease

    @property
    def combined_claim(self) -> CombinedClaim | None:
        """Slots, the global rate and the claim in one script: spent only for tasks claimed."""
        return self._claim

    @property
    def combined_ack_claim(self) -> CombinedAckClaim | None:
        """Quiet acks, slots, the global rate and the claim in one script, when the broker can."""
        return self._ack_claim

    def give_back(self, slots: Sequence[Slot]) -> None:
        """Note ``slots`` for the next claim (or `flush`) to give back."""
        self._to_release.extend(s for s in slots if s is not None)

    def take_releases(self) -> list[str]:
        """The noted slots, now the caller's to give back."""
        taken, self._to_release = self._to_release, []
        return taken

    def restore_releases(self, tokens: Sequence[str]) -> None:
        """Note again slots a failed claim may not have given back (a second ZREM is harmless)."""
        self._to_release.extend(tokens)

    async def flush(self) -> None:
        """Give the noted slots back now; a failure only leaves them to expire with their lease."""
        tokens = self.take_releases()
        if not tokens:
            return
        try:
            await self._calls(self._limiter.release_slots, self._queue, tokens, deadline=self._deadline)
        except BrokerError as exc:
            log.warning("queue %r: could not release %d slot(s): %s", self._queue, len(tokens), exc)

    async def take_slots(self, n: int) -> list[Slot]:
        """Up to ``n`` of the queue's global ``workers`` slots (none when the broker fails)."""
        await self.flush()  # noted slots would be refused to us until they are given back
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
        """Give slots back now (with any noted ones); failures only delay them until they expire."""
        self.give_back(slots)
        await self.flush()
