"""Wake-up signals inside one event loop: a re-armable flag for schedulers, events for waiters.

All methods must be called from the event loop's thread (anyio events are not thread-safe);
threads hand results back by returning from ``to_thread.run_sync``.
"""

from __future__ import annotations

from collections import defaultdict

import anyio

__all__ = ["Alarm", "Signal", "TaskWaiters"]


class Signal:
    """A flag one consumer waits on; `fire` before the wait is remembered, not lost."""

    def __init__(self) -> None:
        self._fired = False
        self._event: anyio.Event | None = None

    @property
    def pending(self) -> bool:
        """Fired since the consumer last waited: its next `wait` returns at once."""
        return self._fired

    def fire(self) -> None:
        """Wake the consumer now, or at its next `wait`."""
        if self._fired:
            return  # fired since the consumer last looked: it is woken already
        self._fired = True
        if self._event is not None:
            self._event.set()

    async def wait(self, seconds: float | None) -> bool:
        """Wait up to ``seconds`` (None: forever) for a fire; True when one came."""
        if not self._fired and (seconds is None or seconds > 0):
            self._event = anyio.Event()
            with anyio.move_on_after(seconds):
                await self._event.wait()
            self._event = None
        fired, self._fired = self._fired, False
        return fired


class Alarm:
    """One sleeper waits until a deadline that others may bring forward without waking it now.

    For a sleeper that only has to be up by some time: bringing its deadline forward moves a
    timer, where a `Signal` would wake it at once to sleep again with the new deadline.
    """

    def __init__(self) -> None:
        self._sleep: anyio.CancelScope | None = None

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` (anyio's clock; ``inf``: until brought forward)."""
        with anyio.CancelScope(deadline=deadline) as self._sleep:
            try:
                await anyio.sleep_forever()
            finally:
                self._sleep = None

    def ring_by(self, at: float) -> None:
        """End the current sleep no later than ``at`` (no-op while nobody sleeps)."""
        if self._sleep is not None and at < self._sleep.deadline:
            self._sleep.deadline = at


class TaskWaiters:
    """Events for `Gate.wait` callers, set when this process sees a task reach a final state."""

    def __init__(self) -> None:
        self._events: dict[str, set[anyio.Event]] = defaultdict(set)

    def __bool__(self) -> bool:
        """Whether anyone waits (a caller with many ids to notify can skip them all if not)."""
        return bool(self._events)

    def add(self, task_id: str) -> anyio.Event:
        """A fresh event that is set on the next `notify` of ``task_id`` (or `notify_all`)."""
        event = anyio.Event()
        self._events[task_id].add(event)
        return event

    def discard(self, task_id: str, event: anyio.Event) -> None:
        """Forget ``event`` (the waiter gave up or was answered)."""
        events = self._events.get(task_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._events[task_id]

    def notify(self, task_id: str) -> None:
        """Wake the waiters of ``task_id`` so they re-read it."""
        for event in self._events.pop(task_id, ()):
            event.set()

    def notify_all(self) -> None:
        """Wake every waiter (a cascade may have finished tasks this process never saw)."""
        events, self._events = self._events, defaultdict(set)
        for group in events.values():
            for event in group:
                event.set()
