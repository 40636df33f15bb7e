"""The memory broker's queue holds: one time per held queue, read and written under its lock."""

from __future__ import annotations

from datetime import datetime

from taskgate.brokers.params import HELD_INDEFINITELY, Hold

__all__ = ["HoldBook"]


class HoldBook:
    """Each queue's hold: no claim leases its tasks while ``now`` is before it."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[str, datetime] = {}

    def until(self, queue: str, now: datetime) -> datetime | None:
        """``queue``'s hold at ``now``; None when it is not held (or its hold has ended)."""
        held = self._until.get(queue)
        return held if held is not None and held > now else None

    def extend(self, queue: str, until: datetime) -> None:
        """Hold ``queue`` until ``until``, keeping a longer hold."""
        held = self._until.get(queue)
        if held is None or until > held:
            self._until[queue] = until

    def apply(self, hold: Hold, now: datetime) -> datetime | None:
        """Carry out ``hold`` (`taskgate.brokers.base.Broker.hold`); the queue's hold after it."""
        if hold.resume:
            self._until.pop(hold.queue, None)
            return None
        self.extend(hold.queue, HELD_INDEFINITELY if hold.for_ is None else now + hold.for_)
        return self.until(hold.queue, now)
