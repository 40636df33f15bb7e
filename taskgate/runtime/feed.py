"""The hand-off from a queue's scheduler to its workers: a deque and the workers parked on it.

An anyio memory stream does the same job but builds a receiver object, a task-info record
and an event for every item a waiting worker takes -- more than a short handler costs. Here
`put` gives an item straight to the longest-parked worker (one event set), or queues it when
every worker is busy; `get` takes a queued item without parking at all.

Items are never lost: after `close`, workers take what is queued and then get None; items
still queued when the workers are gone can be taken with `drain`.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

__all__ = ["Feed"]

T = TypeVar("T")


class _Parked(Generic[T]):
    __slots__ = ("event", "item")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.item: T | None = None


class Feed(Generic[T]):
    """Single-producer, many-consumer hand-off inside one event loop (not thread-safe)."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._parked: deque[_Parked[T]] = deque()
        self._closed = False
        self._in_transit = 0  # items handed to parked workers that have not woken up yet

    @property
    def parked(self) -> int:
        """Workers waiting in `get` for an item."""
        return len(self._parked)

    @property
    def in_transit(self) -> int:
        """Items handed to parked workers that have not resumed yet (they will, at a checkpoint)."""
        return self._in_transit

    def put(self, item: T) -> None:
        """Hand ``item`` to a parked worker, or queue it; raises once `close`d."""
        if self._closed:
            raise RuntimeError("the feed is closed")
        if self._parked:
            parked = self._parked.popleft()
            parked.item = item
            parked.event.set()
            self._in_transit += 1
        else:
            self._items.append(item)

    def close(self) -> None:
        """No more items: parked workers get None, and so does every `get` once drained."""
        self._closed = True
        while self._parked:
            self._parked.popleft().event.set()

    async def get(self) -> T | None:
        """The next item (oldest first), waiting for one; None once closed and empty."""
        if self._items:
            await anyio.lowlevel.checkpoint()  # a busy worker still lets others run
            if self._items:
                return self._items.popleft()
        if self._closed:
            return None
        parked: _Parked[T] = _Parked()
        self._parked.append(parked)
        try:
            await parked.event.wait()
        except BaseException:
            if parked.item is not None:
                self._in_transit -= 1
                self._items.appendleft(parked.item)  # handed over as we were cancelled: keep it
            elif parked in self._parked:
                self._parked.remove(parked)
            raise
        if parked.item is not None:
            self._in_transit -= 1
        return parked.item

    def drain(self) -> list[T]:
        """Take every queued item (when no worker will)."""
        items = list(self._items)
        self._items.clear()
        return items
