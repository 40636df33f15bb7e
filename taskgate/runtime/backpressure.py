"""Back-pressure in the runtime: the limit a submit carries, and waiting for room.

The store counts (`taskgate.brokers.params.Submit.max_pending`): a submit to a queue with
``QueueConfig.max_pending`` carries it, and the broker raises `QueueFullError` having stored
nothing when the batch would take the queue past it. With ``on_full="block"`` the runtime
then tries again until the submit fits or the caller's cancel scope ends it: at once when this
process claims or finishes tasks of the queue (`Room.freed`), else after a wait that doubles
up to `MAX_WAIT` (other processes' claims are seen only by trying again). A batch larger than
the limit never fits, so it raises at once either way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from taskgate.brokers.params import Submit, Submitted
from taskgate.config import Config
from taskgate.errors import QueueFullError

__all__ = ["MAX_WAIT", "MIN_WAIT", "PendingLimits", "Room", "limits_of", "store_when_room"]

# Seconds between tries of a blocked submit that nothing in this process woke: from MIN_WAIT,
# doubling to MAX_WAIT (each try is one submit's cost on the store).
MIN_WAIT = 0.01
MAX_WAIT = 0.5


class Room:
    """Per queue, an event this process sets when it may have made room there (a claim, a
    task finished or canceled); blocked submits wait on it. Event-loop only."""

    def __init__(self) -> None:
        self._events: dict[str, anyio.Event] = {}

    def event(self, queue: str) -> anyio.Event:
        """The event the next `freed` of ``queue`` sets (take it before trying, so a room
        freed meanwhile is not missed)."""
        event = self._events.get(queue)
        if event is None:
            event = self._events[queue] = anyio.Event()
        return event

    def freed(self, queue: str) -> None:
        """Wake the submits blocked on ``queue`` (no-op when none is)."""
        event = self._events.pop(queue, None)
        if event is not None:
            event.set()


PendingLimits = tuple[tuple[str, int], ...]  # `Submit.max_pending`


def limits_of(config: Config, queue: str) -> tuple[PendingLimits, bool]:
    """`Submit.max_pending` for a submit to ``queue`` (() when it has no limit), and whether
    such a submit blocks while the queue is full (``on_full="block"``)."""
    conf = config.queue_config(queue)
    if conf is None or not conf.max_pending:
        return (), False
    return ((queue, conf.max_pending),), conf.on_full == "block"


async def store_when_room(
    store: Callable[[Submit], Awaitable[Submitted]],
    submit: Submit,
    *,
    block: bool,
    room: Room,
    check_open: Callable[[], None],
) -> Submitted:
    """``store(submit)`` -- a submit to one limited queue --, tried again while the queue is
    full when ``block`` (see the module docstring); `QueueFullError` at once otherwise, or for
    a batch that can never fit.
    ``check_open`` raises once the gate shuts down, ending the wait."""
    ((queue, _),) = submit.max_pending
    wait = MIN_WAIT
    while True:
        freed = room.event(queue)
        try:
            return await store(submit)
        except QueueFullError as full:
            if not block or full.adding > full.max_pending:
                raise
        with anyio.move_on_after(wait):
            await freed.wait()
        wait = min(wait * 2, MAX_WAIT)
        check_open()
