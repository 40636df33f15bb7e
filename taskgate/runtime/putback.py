"""Putting back what a claim took for a handler that never started: one way for every claim.

A lease whose handler never started goes back as if it had never been claimed (SPEC Part 1,
shutdown: put back "exactly as they were"; a claimed task whose handler never started gives
its quota unit back): its task is requeued (pending, due now, no counter moved), its quota unit
goes back to the window it came from, and its global slot (Redis, where a lease's token is its
slot) is released. Only a start of a global rate, spent when granted, cannot be given back:
fewer starts, never more.

Such leases turn up in two ways, both put back by `PutBack`:

- a claim that answers after its caller stopped waiting (its deadline passed, or the caller
  was cancelled): every claim path -- the plain claim, the claim within a quota, the combined
  limited claim, each of them with acks carried -- names `PutBack.abandoned` as its
  ``on_abandoned``, which runs in the claim's own thread;
- leases the runtime holds whose handlers will not start: claimed while the scheduler was
  cancelled, left in the feed when the workers stopped, one claimed after shutdown's grace
  ran out: `PutBack.now`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from taskgate.brokers.base import Broker, DistributedLimiter, Lease, LimitedClaim, QuotaClaim, QuotaGrant
from taskgate.errors import TaskgateError
from taskgate.runtime.calls import BrokerCalls
from taskgate.task import Task

__all__ = ["Held", "PutBack", "held_by"]

log = logging.getLogger("taskgate")

# A lease and the quota grant its unit came from (None: no quota).
Held = tuple[Lease, QuotaGrant | None]
# One step of a put-back: a broker method, its arguments, and what a failure leaves behind.
_Step = tuple[Callable[..., Any], tuple[Any, ...], str]


def held_by(answer: object) -> list[Held]:
    """The leases (and their grants) in what any claim path answered.

    ``answer`` is a `Broker.claim`'s list of leases, a `QuotaClaim`, a `LimitedClaim` or None,
    or a pair whose second item is one of those: the acks' answers and the claim of a claim
    that carried acks.
    """
    match answer:
        case None:
            return []
        case list():
            return [(lease, None) for lease in answer]
        case QuotaClaim(leases=leases, grant=grant):
            return [(lease, grant) for lease in leases]
        case LimitedClaim(leases=leases, quota=quota):
            units = None if quota is None else quota.grant
            return [(lease, units) for lease in leases]
        case (_, claimed):
            return held_by(claimed)
    raise TypeError(f"not the answer of a claim: {answer!r}")


class PutBack:
    """Puts back one queue's leases whose handlers never started (see the module docstring).

    ``slots``: the broker's limiter when each lease's token is a global slot (the queue claims
    through `DistributedLimiter.claim_with_limits`), else None.
    """

    def __init__(self, broker: Broker, queue: str, *, slots: DistributedLimiter | None) -> None:
        self._broker, self._queue, self._slots = broker, queue, slots

    def abandoned(self, answer: object) -> None:
        """``on_abandoned`` of a claim call nobody waits for any more: put back what it claimed.

        Runs in the call's thread, with nobody to tell: failures are logged.
        """
        held = held_by(answer)
        for fn, args, failed in self._steps(held):
            try:
                fn(*args)
            except TaskgateError as exc:
                log.warning("%s: %s", failed, exc)

    async def now(self, held: Sequence[Held], calls: BrokerCalls, *, deadline: float) -> list[Task]:
        """Put ``held`` back through the runtime's broker calls; the snapshots of the tasks
        requeued. Each step is a broker call of its own (a call attempted on the event loop
        must change nothing before it may be run again in a thread); failures are logged."""
        requeued: list[Task] = []
        for fn, args, failed in self._steps(held):
            try:
                answer = await calls(fn, *args, deadline=deadline)
            except TaskgateError as exc:
                log.warning("%s: %s", failed, exc)
                continue
            if isinstance(answer, Task):
                requeued.append(answer)
        return requeued

    def _steps(self, held: Sequence[Held]) -> list[_Step]:
        """Requeue each lease, then give its quota unit back, then its global slot."""
        broker = self._broker
        steps: list[_Step] = [
            (
                broker.requeue,
                (lease.task.id, lease.token),
                f"task {lease.task.id}: a lease whose handler never started could not be put back "
                "(the reaper takes it back when it expires)",
            )
            for lease, _ in held
        ]
        # A unit per lease, given back to its own claim's grant (never more than it granted).
        units: dict[int, tuple[QuotaGrant, int]] = {}
        for _, grant in held:
            if grant is not None:
                units[id(grant)] = (grant, units.get(id(grant), (grant, 0))[1] + 1)
        for grant, n in units.values():
            failed = f"quota {grant.key!r}: {n} unit(s) of tasks whose handlers never started stay spent"
            steps.append((broker.release_quota, (grant, n), failed))
        if self._slots is not None and held:
            tokens = [lease.token for lease, _ in held]
            failed = f"queue {self._queue!r}: {len(tokens)} slot(s) stay taken until their leases expire"
            steps.append((self._slots.release_slots, (self._queue, tokens), failed))
        return steps
