"""Putting back what a claim took for a handler that never started: one way for every claim.

A lease whose handler never started goes back as if it had never been claimed (SPEC Part 1,
shutdown: put back "exactly as they were"; a claimed task whose handler never started gives
its quota unit back): its task is requeued (pending, due now, no counter moved), its quota unit
goes back to the window it came from, and its shared slot (where the broker counts the limits,
a lease's token is its slot) is released -- one `Broker.settle` with a `Requeue` per lease and
a `GiveBack`. Only a start of a global rate, spent when granted, cannot be given back:
fewer starts, never more.

Such leases turn up in two ways, both put back by `PutBack`:

- a claim that answers after its caller stopped waiting (its deadline passed, or the caller
  was cancelled): every claim names `PutBack.abandoned` as its ``on_abandoned``, which runs
  in the claim's own thread;
- leases the runtime holds whose handlers will not start: claimed while the scheduler was
  cancelled, left in the feed when the workers stopped, one claimed after shutdown's grace
  ran out: `PutBack.now`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from taskgate.brokers.base import Broker, Lease, QuotaGrant
from taskgate.brokers.params import Claimed, GiveBack, Requeue, Settle
from taskgate.errors import TaskgateError
from taskgate.runtime.calls import BrokerCalls
from taskgate.task import Task

__all__ = ["Held", "PutBack", "held_by"]

log = logging.getLogger("taskgate")

# A lease and the quota grant its unit came from (None: no quota).
Held = tuple[Lease, QuotaGrant | None]


def held_by(answer: object) -> list[Held]:
    """The leases (and their grant) in what a claim answered (a `Claimed`, or None)."""
    if answer is None:
        return []
    if isinstance(answer, Claimed):
        return [(lease, answer.quota) for lease in answer.leases]
    raise TypeError(f"not the answer of a claim: {answer!r}")


class PutBack:
    """Puts back one queue's leases whose handlers never started (see the module docstring).

    ``slots``: each lease's token is a shared slot of the queue (the broker counts its limits).
    """

    def __init__(self, broker: Broker, queue: str, *, slots: bool) -> None:
        self._broker, self._queue, self._slots = broker, queue, slots

    def abandoned(self, answer: object) -> None:
        """``on_abandoned`` of a claim call nobody waits for any more: put back what it claimed.

        Runs in the call's thread, with nobody to tell: failures are logged.
        """
        settle = self._settle(held_by(answer))
        if settle is None:
            return
        try:
            self._broker.settle(settle)
        except TaskgateError as exc:
            log.warning("%s", self._failed(settle, exc))

    async def now(self, held: Sequence[Held], calls: BrokerCalls, *, deadline: float) -> list[Task]:
        """Put ``held`` back through the runtime's broker calls, in one call; the snapshots of
        the tasks requeued (or canceled instead, when a cancel was asked). Failures are logged."""
        settle = self._settle(held)
        if settle is None:
            return []
        try:
            answers = await calls(self._broker.settle, settle, deadline=deadline)
        except TaskgateError as exc:
            log.warning("%s", self._failed(settle, exc))
            return []
        return [answer for answer in answers if isinstance(answer, Task)]

    def _settle(self, held: Sequence[Held]) -> Settle | None:
        """Requeue each lease, and give back its quota unit and its shared slot."""
        if not held:
            return None
        # A unit per lease, given back to its own claim's grant (never more than it granted).
        units: dict[int, tuple[QuotaGrant, int]] = {}
        for _, grant in held:
            if grant is not None:
                units[id(grant)] = (grant, units.get(id(grant), (grant, 0))[1] + 1)
        slots = tuple(lease.token for lease, _ in held) if self._slots else ()
        give_back = GiveBack(quota=tuple(units.values()), queue=self._queue if slots else None, slots=slots)
        return Settle(tuple(Requeue(lease.task.id, lease.token) for lease, _ in held), give_back=give_back)

    def _failed(self, settle: Settle, exc: Exception) -> str:
        ids = ", ".join(item.task_id for item in settle.items)
        return (
            f"queue {self._queue!r}: leases whose handlers never started could not be put back "
            f"(tasks {ids}; the reaper takes them back when they expire, their quota units stay "
            f"spent and their slots taken until then): {exc}"
        )
