"""Group calls: tasks that call at about the same time share ONE broker call (group commit).

There is no fixed delay. The first caller while no flush is in flight becomes the leader: it
lets the event loop run once (callers arriving in the same tick join it) and flushes. Callers
arriving while a flush is in flight queue up; when it returns, the first of them leads the
next flush, taking everything queued. The batch size thus follows the load: one at a time
when idle, everything that piled up during one round trip under load.

Every caller gets the answer for its own item, after the flush that carried it returned.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

__all__ = ["GroupCall"]

I = TypeVar("I")  # noqa: E741 (one item)
A = TypeVar("A")  # its answer

Flush = Callable[[list[I]], Awaitable[Sequence[A | Exception]]]


@dataclass(eq=False)
class _Waiter(Generic[I, A]):
    """One caller: answered, or told to lead the next flush."""

    item: I
    woken: anyio.Event = field(default_factory=anyio.Event)
    answer: A | Exception | None = None
    answered: bool = False
    lead: bool = False


class GroupCall(Generic[I, A]):
    """``await group(item)`` gives ``item``'s answer from ``flush(items)`` (or raises its error).

    ``flush`` answers every item in order, an `Exception` for an item that failed; if it raises,
    every item of that flush gets the exception. Call from tasks shielded from cancellation: a
    leader cancelled half way would leave the others waiting.
    """

    def __init__(self, flush: Flush[I, A], *, max_batch: int) -> None:
        self._flush_items = flush
        self._max_batch = max_batch
        self._queued: deque[_Waiter[I, A]] = deque()
        self._flushing = False
        self._idle: anyio.Event | None = None

    async def __call__(self, item: I) -> A:
        """Send ``item`` with whatever else is waiting; its answer, or its error raised."""
        waiter: _Waiter[I, A] = _Waiter(item)
        self._queued.append(waiter)
        if self._flushing:
            await waiter.woken.wait()
        else:
            self._flushing = waiter.lead = True
        if waiter.lead:
            await self._lead()
        assert waiter.answered, "a group call waiter was woken without an answer"
        if isinstance(waiter.answer, Exception):
            raise waiter.answer
        return waiter.answer  # type: ignore[return-value]

    async def settled(self) -> None:
        """Return once no call is queued or in flight (e.g. before reading what they changed)."""
        while self._flushing:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()

    async def _lead(self) -> None:
        """Flush what is queued (this caller first), then hand the lead on or go idle."""
        try:
            # One loop tick, never cancelled (others wait on this leader): callers arriving
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
                idle, self._idle = self._idle, None
                if idle is not None:
                    idle.set()

    async def _flush(self, batch: Sequence[_Waiter[I, A]]) -> None:
        answers: list[A | Exception] = [RuntimeError("the group flush was interrupted")] * len(batch)
        try:
            answers = list(await self._flush_items([w.item for w in batch]))
        except Exception as exc:  # the whole call failed: every item gets that answer
            answers = [exc] * len(batch)
        finally:
            for waiter, answer in zip(batch, answers, strict=True):
                waiter.answer, waiter.answered = answer, True
                waiter.woken.set()
