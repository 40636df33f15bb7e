"""One queue's claim loop and its workers: free workers -> rate -> quota -> ``claim`` k tasks.

Each queue has its own scheduler task, limits and quota, so a slow, rate-limited or
quota-exhausted queue never delays another. A same-process submit fires the queue's
`Signal` (no polling delay); delayed and retrying tasks become due by polling every
``poll_interval``.

A claim asks only for the types this gate has handlers for in the queue
(`QueueScheduler.types`, kept current by the runtime as handlers are registered): a task of
another type waits for a process that can run it, and a queue whose only due tasks are of
such types finds nothing, goes idle and waits its poll interval.

Claimed leases go to the queue's ``workers`` long-lived worker tasks through a `Feed`, and
finished handlers' acks to the queue's `AckWriter`: no task is spawned per run.

A lease whose handler never starts -- claimed by a call that answered too late, left in the
feed when the workers stop, or come back just after a queue-wide throttle here -- goes back with
its quota unit and slot (`taskgate.runtime.putback`).

A held queue (`Gate.pause`, a queue-wide `Throttled`: claims answer ``Claimed.held_until``)
claims nothing; its scheduler looks again when the hold ends or after a poll interval, whichever
comes first, so a resume in another process is seen within one poll interval.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Coroutine
from contextlib import nullcontext
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.lowlevel

from taskgate.brokers.base import Broker, Lease, QuotaGrant
from taskgate.brokers.params import HELD_INDEFINITELY, Claim, Claimed, Complete, SharedLimits
from taskgate.config import QueueConfig
from taskgate.errors import BrokerError
from taskgate.runtime.acks import AckWriter
from taskgate.runtime.backoff import exponential
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.context import Lane
from taskgate.runtime.feed import Feed
from taskgate.runtime.limits import Limits, Slot
from taskgate.runtime.observers import CURRENT_QUEUE
from taskgate.runtime.putback import Held, PutBack
from taskgate.runtime.quota import QuotaGate
from taskgate.runtime.signals import Signal
from taskgate.task import Task

__all__ = ["QueueScheduler"]

log = logging.getLogger("taskgate")

# Runs one claimed lease until its task is settled: (lease, its concurrency slot, the local
# time the claim began -- the lease cannot end earlier than that plus its TTL --, the quota
# grant its unit came from).
StartLease = Callable[[Lease, Slot, float, QuotaGrant | None, Lane], Coroutine[Any, Any, None]]
# Told the snapshots of tasks put back (`put_back`).
Requeued = Callable[[list[Task]], Coroutine[Any, Any, None]]
ClaimedLease = tuple[Lease, Slot, float, QuotaGrant | None]
# What one claim took: its leases, and the quota grant of their units (None without a quota).
Taken = tuple[list[Lease], QuotaGrant | None]

# Acks waiting to be written may reach this many times ``workers`` before they hold claims
# back: enough for the writer's batches to grow past one round of workers under load (one
# `ack_many` per several claims), few enough that a crash re-runs little.
ACK_ALLOWANCE = 4


class QueueScheduler:
    """Claims tasks of one queue within its limits and hands them to the executor."""

    def __init__(
        self,
        name: str,
        conf: QueueConfig,
        *,
        broker: Broker,
        calls: BrokerCalls,
        limits: Limits,
        quota: QuotaGate | None,
        poll_interval: float,
        deadline: float,
        acks: AckWriter,
        on_requeued: Requeued,
        types: tuple[str, ...],
    ) -> None:
        """``on_requeued`` is told the snapshots of tasks put back (`put_back`); ``types``: the
        types this gate has handlers for in the queue (see `handle_types`)."""
        self.name, self.conf = name, conf
        self.types = types
        self.acks = acks  # the queue's group commit of acks (see `taskgate.runtime.acks`)
        self._ready: Feed[ClaimedLease] = Feed()
        self._broker, self._calls = broker, calls
        self.limits, self.quota = limits, quota
        # Under shared limits each lease's token is its slot.
        self._put_back = PutBack(broker, name, slots=limits.shared_counted)
        self._on_requeued = on_requeued
        self._poll = poll_interval
        self.deadline = deadline  # of a worker-path broker call (`worker_deadline`)
        self.lease_seconds = conf.lease.total_seconds()
        self.signal = Signal()
        self.running = 0
        self._stopping = False
        self._paused_until = 0.0
        # Holds (a pause, a queue-wide throttle): until when this process starts nothing of the
        # queue (`hold_here`), and whether the store answered the last claim "held".
        self._held_here_until = 0.0
        self._held_here_since = 0.0
        self._store_holds = False
        self._claim_failures = 0
        self._claim_started = 0.0
        self._held_by_rate = False  # the last combined claim left due tasks for the rate
        # The last claim found less than it asked for: nothing more may be due. Rate tokens
        # and quota units taken for an empty claim are spent for good on a shared limiter,
        # so an idle queue asks whether work is due before taking them (see `_cycle`). A new
        # scheduler knows nothing yet: it asks first.
        self._idle = True
        self._metered = conf.rps > 0 or conf.has_quota
        self.on_idle: Callable[[], None] = lambda: None  # called when a claim comes back short
        self.on_claimed: Callable[[], None] = lambda: None  # called when a claim leased tasks

    @property
    def idle(self) -> bool:
        """The last claim found less than it asked for (or none was made yet), and the queue
        is not held.

        Only an idle queue waits for news of work; a busy one claims again by itself as soon
        as a worker is free, and a held one looks again every poll interval by itself.
        """
        return self._idle and not self._store_holds and not self.held

    @property
    def held(self) -> bool:
        """This process starts nothing of the queue now: a throttle or pause made here holds it."""
        # Asked before every start: the clock is read only while a hold is set.
        return self._held_here_until > 0.0 and anyio.current_time() < self._held_here_until

    def hold_here(self, seconds: float | None) -> None:
        """Claim and start nothing for ``seconds`` (None: until the store answers a claim
        unheld), looking at the store again every poll interval meanwhile (a resume elsewhere)."""
        now = anyio.current_time()
        left = math.inf if seconds is None else seconds
        self._held_here_until, self._held_here_since = now + left, now
        self._paused_until = max(self._paused_until, now + min(self._poll, left))

    def resume_here(self) -> None:
        """The queue was resumed: claim again now."""
        self._held_here_until = 0.0
        self._store_holds = False
        self._paused_until = 0.0
        self.wake()

    def handle_types(self, types: tuple[str, ...]) -> None:
        """From the next claim on, claim tasks of ``types`` (sorted, without repeats: a handler
        was registered while running); look now, tasks of a new type may be waiting."""
        self.types = types
        self.wake()

    def stop(self) -> None:
        """Stop claiming; the loop ends at its next check."""
        self._stopping = True
        self.signal.fire()

    def wake(self, *, new_work: bool = True) -> None:
        """Look again now: work was queued (``new_work``), or a slot freed / a child may be due.

        Only news of queued work skips the idle queue's "is anything due?" check.
        """
        if new_work:
            self._idle = False
        self.signal.fire()

    def _free_workers(self) -> int:
        """Workers free for new leases: idle ones, less acks waiting beyond their allowance."""
        return self.conf.workers - self.running - self.acks.backlog_beyond(ACK_ALLOWANCE * self.conf.workers)

    async def put_back(self, held: list[Held]) -> None:
        """Put back leases whose handlers never started, with their quota units and slots
        (`PutBack.now`), and tell ``on_requeued`` what became of their tasks."""
        requeued = await self._put_back.now(held, self._calls, deadline=self.deadline)
        if requeued:
            await self._on_requeued(requeued)

    async def run(self, start: StartLease) -> None:
        """Claim until `stop`; the queue's workers run the claimed leases through ``start``.

        After `stop` the workers finish what was claimed and the ack writer drains. When the
        runtime is cancelled instead, leases claimed but not yet started are put back.
        """
        CURRENT_QUEUE.set(self.name)  # this task's and its children's broker errors are the queue's
        async with anyio.create_task_group() as writer:
            writer.start_soon(self.acks.run)
            try:
                async with anyio.create_task_group() as workers:
                    for _ in range(self.conf.workers):
                        workers.start_soon(_work, self._ready, start)
                    while self._ready.parked < self.conf.workers:
                        await anyio.lowlevel.checkpoint()  # the first claim finds them waiting
                    try:
                        while not self._stopping:
                            await self._cycle()
                    finally:
                        self._ready.close()
            finally:
                self.acks.close()
                with anyio.CancelScope(shield=True):
                    await self._requeue_unstarted()
                    await self.limits.flush()

    async def _requeue_unstarted(self) -> None:
        """Put back leases claimed but never started (the workers were cancelled first), with
        their quota units and slots: no handler ran for them."""
        unstarted = self._ready.drain()
        if unstarted:
            self.running -= len(unstarted)
            await self.put_back([(lease, grant) for lease, _, _, grant in unstarted])

    async def _cycle(self) -> None:
        now = anyio.current_time()
        free = self._free_workers()
        if now < self._paused_until:
            await self.limits.flush()
            await self.signal.wait(self._paused_until - now)
            return
        if free <= 0:
            # Slots noted free here are those of runs whose acks hold claims back: the claim
            # that follows the acks' write hands them over (kept meanwhile, they only make the
            # queue run fewer tasks at once, never more).
            await self.signal.wait(None)
            return
        if self._idle and self._metered and not await self._work_due():
            await self.limits.flush()
            await self.signal.wait(self._poll)
            return
        claimed = await self._claim_within_limits(free)
        if claimed is None:
            return
        leases, slots, grant = claimed
        if leases:
            self.on_claimed()
        # Leases that come back after `stop` still run: graceful shutdown finishes the work
        # already claimed (the runtime puts them back once the shutdown grace is over).
        for lease, slot in zip(leases, slots, strict=False):
            self.running += 1
            self._ready.put((lease, slot, self._claim_started, grant))
        while self._ready.in_transit:
            # The workers just handed a lease start their handlers before this queue claims
            # again: a claim may run on the event loop (inline brokers) and hold it meanwhile.
            await anyio.lowlevel.checkpoint()
        self._idle = len(leases) < len(slots)
        if self._idle:
            self.on_idle()
            if not self.signal.pending:
                # Slots freed meanwhile must not wait out the poll. When the queue's handlers
                # already fired the signal, the next claim gives them back in its own call.
                await self.limits.flush()
            await self.signal.wait(self._poll)

    async def _claim_within_limits(
        self, free: int
    ) -> tuple[list[Lease], list[Slot], QuotaGrant | None] | None:
        """Take slots, rate and quota for up to ``free`` starts, then claim: the leases, their
        slots (then None for each start not claimed), their quota grant; None when paused."""
        shared = self.limits.shared()
        if shared is not None:
            # Shared slots, rate, quota and the claim in one call; each lease's token is its slot.
            taken = await self._claim(free, shared)
            if taken is None:
                return None
            leases, grant = taken
            # Fewer tasks than asked is a sign of an idle queue -- unless the rate held them back.
            unused = 0 if self._held_by_rate else free - len(leases)
            return leases, [*(lease.token for lease in leases), *[None] * unused], grant
        granted, wait = await self.limits.take_rate(free)
        if granted <= 0:
            self._pause(max(wait, 0.001))
            return None
        taken = await self._claim(granted, None)
        got = [] if taken is None else taken[0]
        self.limits.spent(granted, len(got))
        if taken is None:
            return None
        return got, [None] * granted, taken[1]

    async def _claim(self, n: int, shared: SharedLimits | None) -> Taken | None:
        self._claim_started = anyio.current_time()
        quota = None if self.quota is None else self.quota.spec
        claim = Claim(self.name, n, self.conf.lease, quota=quota, shared=shared, types=self.types)
        try:
            # Shielded: an abandoned claim thread would still lease tasks that nobody runs,
            # stranding them until their lease expires (and costing them a lease_lost). A
            # broker called inline has no thread to abandon: a cancellation lands at the call's
            # checkpoint, before it claims (and a scope per claim is a tenth of a memory cycle);
            # the slots the claim was to give back are then kept for the last flush.
            shield = not self._calls.inline
            with anyio.CancelScope(shield=True) if shield else nullcontext():
                try:
                    claimed = await self._claim_by(claim)
                except anyio.get_cancelled_exc_class():
                    if shared is not None:
                        self.limits.restore_releases(shared.release)
                    raise
            taken = claimed.leases, claimed.quota
            await self._put_back_if_cancelled(taken)
        except BrokerError as exc:
            if shared is not None:
                # Slots of finished handlers the claim was to give back: keep them for the next.
                self.limits.restore_releases(shared.release)
            if self.quota is not None:
                self.quota.unreachable()
            self._claim_failures += 1
            backoff = exponential(self._claim_failures, base=self._poll / 2, cap=10.0)
            log.warning("queue %r: claim failed (retry in %.2fs): %s", self.name, backoff, exc)
            self._pause(backoff)
            return None
        self._claim_failures = 0
        if claimed.held_until is not None:
            self._held_by_store(claimed.held_until)
            return None
        self._store_holds = False
        if self._claim_started >= self._held_here_since:
            self._held_here_until = 0.0  # asked after the hold was set, the store holds nothing
        self._held_by_rate = claimed.retry_after > 0
        if self._held_by_rate:
            self._pause(claimed.retry_after)
        if self.quota is not None:
            self.quota.took(claimed)
            if self.quota.exhausted:
                self._pause(self.quota.pause)
                return None
        return taken

    async def _put_back_if_cancelled(self, taken: Taken) -> None:
        """Put a claim's fresh leases back, units and slots too, when the scheduler was
        cancelled during the claim: no worker will start them."""
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            leases, grant = taken
            with anyio.CancelScope(shield=True):
                await self.put_back([(lease, grant) for lease in leases])
            raise

    async def _claim_by(self, claim: Claim) -> Claimed:
        """``claim`` in one broker call, taking along the acks waiting to be written when they
        may ride (`AckWriter.with_claim`).

        A call that answers after its deadline puts back what it claimed (`PutBack.abandoned`,
        in the call's thread): nobody will run those leases, and waiting for them to expire
        would cost their tasks a lease_lost, a quota unit and a slot.
        """
        late = self._put_back.abandoned

        async def call(acks: tuple[Complete, ...]) -> Claimed:
            carrying = claim if not acks else dataclasses.replace(claim, acks=acks)
            return await self._calls(self._broker.claim, carrying, deadline=self.deadline, on_abandoned=late)

        return await self.acks.with_claim(call)

    async def _work_due(self) -> bool:
        """Whether a task of this queue is due now (a zero-timeout `wait_for_work`)."""
        try:
            return await self._calls(self._broker.wait_for_work, [self.name], 0, deadline=self.deadline)
        except BrokerError:
            return True  # let the claim path meet the error and back off

    def _pause(self, seconds: float) -> None:
        self._paused_until = anyio.current_time() + seconds

    def _held_by_store(self, until: datetime) -> None:
        """The queue is held until ``until`` (the store's clock): look again when that comes,
        by this host's clock, or after a poll interval, whichever is first -- a resume in
        another process is seen within one poll interval."""
        self._store_holds = True
        left = (until - datetime.now(UTC)).total_seconds() if until < HELD_INDEFINITELY else math.inf
        # A hold this host's clock sees ended already: the clocks differ, look again soon.
        self._pause(min(self._poll, left if left > 0 else 0.05))


async def _work(feed: Feed[ClaimedLease], start: StartLease) -> None:
    """One worker: run claimed leases one after another until the feed is closed and empty.

    Handlers run in the worker's `Lane`: one cancel scope, entered once and kept until a
    handler stopped in it spends it (the cancellation ends the ``with``), then a new one.
    """
    lane = Lane()
    while True:
        with lane.open():
            while not lane.spent:
                claimed = await feed.get()
                if claimed is None:
                    return
                await start(*claimed, lane)
