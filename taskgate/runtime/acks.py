"""Group commit of acks: handlers of one queue that finish together complete in ONE `ack_many`.

The grouping is `taskgate.runtime.group.GroupCall` (no fixed delay; the batch size follows
the load: one at a time when idle, up to every worker of the queue under load).

Each caller gets the answer of its own item. The handler's worker slot went back when the
handler finished (`RunContext.handler_done`), so the queue's next claim overlaps this write:
``workers`` bounds running handlers, not writes in flight. Shutdown still waits for every
flush (the executor awaits the answer). A crash before a flush leaves those tasks running
under their leases: the reaper puts them back and they run again -- a re-run, never a loss.
"""

from __future__ import annotations

from collections.abc import Sequence

from taskgate.brokers.base import AckItem, AckOutcome, Broker
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.group import GroupCall
from taskgate.task import Task

__all__ = ["MAX_ACK_BATCH", "AckBatcher"]

# Items per `ack_many`: bounds one statement/script; more wait for the next flush.
MAX_ACK_BATCH = 256


class AckBatcher:
    """Acks of one queue, written by group commit (`GroupCall`); `ack` behaves like ``broker.ack``."""

    def __init__(
        self, broker: Broker, calls: BrokerCalls, *, deadline: float, max_batch: int = MAX_ACK_BATCH
    ) -> None:
        self._broker, self._calls, self._deadline = broker, calls, deadline
        self._group: GroupCall[AckItem, Task] = GroupCall(self._write, max_batch=max_batch)

    async def ack(self, task_id: str, token: str, result: bytes | None) -> Task:
        """Complete the task; raises what ``broker.ack`` would (`LeaseLostError`, `BrokerError`, …).

        Call it shielded from cancellation (the executor settles shielded).
        """
        return await self._group((task_id, token, result))

    async def _write(self, items: list[AckItem]) -> Sequence[AckOutcome | Exception]:
        try:
            return await self._calls(self._broker.ack_many, items, deadline=self._deadline)
        except (TypeError, ValueError):
            if len(items) == 1:
                raise
        # One item the broker refuses (a result too large for the server) must not fail the
        # others: ack them one by one so each gets its own answer.
        return [await self._write_one(item) for item in items]

    async def _write_one(self, item: AckItem) -> AckOutcome | Exception:
        try:
            return await self._calls(self._broker.ack, *item, deadline=self._deadline)
        except Exception as exc:
            return exc
