"""Concurrency slots and start rate of one queue: local to this process, or global via the broker.

`LocalLimits` counts slots in memory and meters starts with a `TokenBucket`;
`SharedQueueLimits` has every claim carry the limits (`Claim.shared`) to a broker that counts
them for all its processes (``capabilities.shared_limits``).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import Protocol

import anyio

from taskgate.brokers.base import Broker
from taskgate.brokers.params import GiveBack, Settle, SharedLimits
from taskgate.config import QueueConfig
from taskgate.errors import BrokerError
from taskgate.runtime.bucket import TokenBucket
from taskgate.runtime.calls import BrokerCalls

__all__ = ["Limits", "LocalLimits", "SharedQueueLimits"]

log = logging.getLogger("taskgate")

Slot = str | None


class Limits(Protocol):
    """Slots and rate for one queue's scheduler."""

    @property
    def shared_counted(self) -> bool:
        """Whether the broker counts the limits (then each lease's token is its slot)."""
        ...

    def shared(self) -> SharedLimits | None:
        """The `Claim.shared` field for the next claim, when the broker counts the limits:
        slots, rate and claim in one call, after giving back the slots noted by `give_back`
        (now owned by that claim; `restore_releases` when it failed). Each lease's token is
        then its slot. None: the limits are this process's (`take_rate`, `spent`)."""
        ...

    def give_back(self, slot: str) -> None:
        """Note ``slot`` as free; it goes back with the next claim or `flush` (never waits)."""
        ...

    def restore_releases(self, tokens: Sequence[str]) -> None:
        """Slots a failed claim may not have given back: keep them for the next try."""
        ...

    async def flush(self) -> None:
        """Give back the noted slots now (before the scheduler waits, and when it stops)."""
        ...

    async def take_rate(self, n: int) -> tuple[int, float]:
        """Up to ``n`` starts allowed now, and the wait before the next one when fewer."""
        ...

    def spent(self, granted: int, used: int) -> None:
        """``used`` of ``granted`` starts happened (a local bucket pays only for these)."""
        ...


class LocalLimits:
    """Per-process limits: the local worker count is the slot count, the bucket meters starts."""

    shared_counted = False

    def __init__(self, conf: QueueConfig) -> None:
        self._bucket = TokenBucket(conf.rps, conf.burst, anyio.current_time())

    def shared(self) -> SharedLimits | None:
        """Counted here: nothing for the claim to carry."""
        return None

    def give_back(self, slot: str) -> None:
        """Local slots are the scheduler's running count: nothing to note."""

    def restore_releases(self, tokens: Sequence[str]) -> None:
        """Nothing is ever noted."""

    async def flush(self) -> None:
        """Nothing is ever noted."""

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


class SharedQueueLimits:
    """Limits the broker counts across processes (``capabilities.shared_limits``): each claim
    carries them (`Claim.shared`), and a slot expires with its lease."""

    shared_counted = True

    def __init__(
        self, broker: Broker, calls: BrokerCalls, queue: str, conf: QueueConfig, deadline: float
    ) -> None:
        self._broker, self._calls, self._queue, self._conf = broker, calls, queue, conf
        self._deadline = deadline
        # Slots of finished handlers, given back by the next claim's own call (no round trip
        # of their own) or by `flush` when no claim comes first. Held a little longer, a slot
        # only makes the queue run fewer tasks at once, never more.
        self._to_release: list[str] = []
        self._claimer = secrets.token_hex(8)  # this scheduler, in the broker's turn-taking

    def shared(self) -> SharedLimits | None:
        """The queue's workers and rate, and the slots to give back first."""
        release, self._to_release = self._to_release, []
        conf = self._conf
        return SharedLimits(
            workers=conf.workers,
            rps=conf.rps,
            burst=conf.effective_burst,
            release=tuple(release),
            claimer=self._claimer,
            group_workers=conf.group_workers,
            group_rps=conf.group_rps,
            group_burst=conf.effective_group_burst if conf.group_rps else 0,
            group_quota_limit=conf.group_quota_limit,
            group_quota_period=conf.period if conf.group_quota_limit else None,
        )

    def give_back(self, slot: str) -> None:
        """Note ``slot`` for the next claim (or `flush`) to give back."""
        self._to_release.append(slot)

    def restore_releases(self, tokens: Sequence[str]) -> None:
        """Note again slots a failed claim may not have given back (a second release is harmless)."""
        self._to_release.extend(tokens)

    async def flush(self) -> None:
        """Give the noted slots back now; a failure only leaves them to expire with their lease."""
        tokens, self._to_release = self._to_release, []
        if not tokens:
            return
        give_back = Settle(give_back=GiveBack(queue=self._queue, slots=tuple(tokens)))
        try:
            await self._calls(self._broker.settle, give_back, deadline=self._deadline)
        except BrokerError as exc:
            log.warning("queue %r: could not release %d slot(s): %s", self._queue, len(tokens), exc)

    async def take_rate(self, n: int) -> tuple[int, float]:
        """The rate is taken by the claim itself."""
        return n, 0.0

    def spent(self, granted: int, used: int) -> None:
        """Starts were spent by the claim that granted them."""
