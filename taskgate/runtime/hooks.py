"""Delivery of ``on_state_change`` outside every lock, transaction and worker.

Snapshots go into an unbounded memory stream; one consumer task calls the hook (a plain
function directly, a coroutine function awaited). Exceptions are logged and swallowed, and a
slow hook delays only later hook calls, never a worker.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Iterable

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from taskgate.config import StateChangeHook
from taskgate.task import Task

__all__ = ["HookDispatcher", "call_hook"]

log = logging.getLogger("taskgate")


async def call_hook(hook: StateChangeHook, task: Task) -> None:
    """Call ``hook(task)``, awaiting it when it returns an awaitable; log and swallow errors."""
    try:
        value = hook(task)
        if inspect.isawaitable(value):
            await value
    except Exception:
        log.exception("on_state_change hook raised for task %s (%s); ignored", task.id, task.status)


class HookDispatcher:
    """Queues state changes for the hook; `run` drains them until the stream is closed."""

    def __init__(self, hook: StateChangeHook | None) -> None:
        self.hook = hook
        self._send: MemoryObjectSendStream[Task] | None = None
        self._receive: MemoryObjectReceiveStream[Task] | None = None
        self._calling = False

    @property
    def active(self) -> bool:
        """True while a consumer task is draining the stream."""
        return self._send is not None

    @property
    def idle(self) -> bool:
        """Nothing is queued for the hook and no call of it is under way."""
        send = self._send
        return not self._calling and (send is None or send.statistics().current_buffer_used == 0)

    async def emit(self, tasks: Iterable[Task]) -> None:
        """Hand ``tasks`` to the consumer, or call the hook inline when none runs (client use)."""
        if self.hook is None:
            return
        if self._send is not None:
            for task in tasks:
                self._send.send_nowait(task)
            return
        for task in tasks:
            await call_hook(self.hook, task)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Consume until `close`; started by the runtime's task group."""
        send, receive = anyio.create_memory_object_stream[Task](math.inf)
        self._send, self._receive = send, receive
        task_status.started()
        async with receive:
            async for task in receive:
                if self.hook is not None:
                    self._calling = True
                    try:
                        await call_hook(self.hook, task)
                    finally:
                        self._calling = False

    def close(self) -> None:
        """Stop accepting; the consumer delivers what is queued, then ends."""
        send, self._send = self._send, None
        if send is not None:
            send.close()
