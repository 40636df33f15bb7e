"""Group commit of acks: handlers of one queue that finish together complete in ONE `ack_many`.

There is no fixed delay. The first handler to finish while no flush is in flight becomes the
leader: it lets the event loop run once (handlers finishing in the same tick join it) and
flushes. Handlers finishing while a flush is in flight queue up; when it returns, the first of
them leads the next flush, taking everything queued. The batch size thus follows the load:
one at a time when idle, up to every worker of the queue under load.

Each caller gets the answer of its own item, and only then does its handler's worker slot go
back (the executor awaits the answer), so ``workers`` still bounds running handlers exactly
and shutdown waits for every flush. A crash before a flush leaves those tasks running under
their leases: the reaper puts them back and they run again -- a re-run, never a loss.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel

from taskgate.brokers.base import AckItem, AckOutcome, Broker
from taskgate.runtime.calls import BrokerCalls
from taskgate.task import Task

__all__ = ["MAX_ACK_BATCH", "AckBatcher"]

# Items per `ack_many`: bounds one statement/script; more wait for the next flush.
MAX_ACK_BATCH = 256


@dataclass(eq=False)
class _Waiter:
    """One handler waiting for its ack: answered, or told to lead the next flush."""

    item: AckItem
    woken: anyio.Event = field(default_factory=anyio.Event)
    answer: AckOutcome | Exception | None = None
    lead: bool = False


class AckBatcher:
    """Acks of one queue, written by group commit; `ack` behaves like ``broker.ack``."""

    def __init__(
        self, broker: Broker, calls: BrokerCalls, *, deadline: float, max_batch: int = MAX_ACK_BATCH
    ) -> None:
        self._broker, self._calls = broker, calls
        self._deadline, self._max_batch = deadline, max_batch
        self._queued: deque[_Waiter] = deque()
        self._flushing = False

    async def ack(self, task_id: str, token: str, result: bytes | None) -> Task:
        """Complete the task; raises what ``broker.ack`` would (`LeaseLostError`, `BrokerError`, …).

        Call it shielded from cancellation (the executor settles shielded): a leader that
        stopped half way would leave the others waiting.
        """
        waiter = _Waiter((task_id, token, result))
        self._queued.append(waiter)
        if self._flushing:
            await waiter.woken.wait()
        else:
            self._flushing = waiter.lead = True
        if waiter.lead:
            await self._lead()
        answer = waiter.answer
        if isinstance(answer, Task):
            return answer
        assert answer is not None, "an ack waiter was woken without an answer"
        raise answer

    async def _lead(self) -> None:
        """Flush what is queued (this caller first), then hand the lead on or go idle."""
        try:
            # One loop tick (never cancelled: others wait on this leader): handlers finishing
            # right now join this flush.
            await anyio.lowlevel.cancel_shielded_checkpoint()
            count = min(len(self._queued), self._max_batch)
            await self._flush([self._queued.popleft() for _ in range(count)])
        finally:
            if self._queued:
                following = self._queued[0]
                following.lead = True
                following.woken.set()
            else:
                self._flushing = False

    async def _flush(self, batch: Sequence[_Waiter]) -> None:
        answers: list[AckOutcome | Exception] = [RuntimeError("the ack flush was interrupted")] * len(batch)
        try:
            answers = list(await self._write([w.item for w in batch]))
        except Exception as exc:  # the medium failed (BrokerError): every item gets that answer
            answers = [exc] * len(batch)
        finally:
            for waiter, answer in zip(batch, answers, strict=True):
                waiter.answer = answer
                waiter.woken.set()

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
