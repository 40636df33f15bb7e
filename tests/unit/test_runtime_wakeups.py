"""The wake-up loop asks the broker about idle queues only, and waits while every queue is busy."""

from __future__ import annotations

import threading
from collections.abc import Collection

import anyio
import pytest

from taskgate.brokers.base import NewTask
from taskgate.brokers.memory import MemoryBroker
from taskgate.runtime.signals import Signal
from taskgate.runtime.wakeups import wait_for_work_forever
from taskgate.testing import steps

pytestmark = pytest.mark.anyio

GUARD = 15.0


class Queue:
    """What the loop reads of a scheduler: whether its last claim came back short."""

    def __init__(self, *, idle: bool) -> None:
        self.idle = idle
        self.woken = 0


class Runtime:
    """The part of the runtime the loop uses, over a real memory broker that records its asks."""

    def __init__(self, broker: MemoryBroker, queues: dict[str, Queue]) -> None:
        self.broker = self
        self._broker = broker
        self.schedulers = queues
        self.queue_idle = Signal()
        self.asked: list[list[str]] = []
        self.asking = threading.Event()
        self.woken = anyio.Event()

    def wait_for_work(self, queues: Collection[str], timeout: float) -> bool:
        self.asked.append(sorted(queues))
        self.asking.set()
        return self._broker.wait_for_work(queues, timeout)

    def wake_all(self, *, new_work: bool = False) -> None:
        assert new_work
        self.woken.set()


async def test_busy_queues_are_not_asked_about_until_one_goes_idle() -> None:
    memory = MemoryBroker()
    runtime = Runtime(memory, {"busy": Queue(idle=False), "later": Queue(idle=False)})
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_work_forever, runtime, 60.0)
            await anyio.wait_all_tasks_blocked()
            assert runtime.asked == []  # parked: nothing to ask while every queue is busy
            runtime.schedulers["later"].idle = True
            runtime.queue_idle.fire()
            await anyio.to_thread.run_sync(runtime.asking.wait, GUARD)
            assert runtime.asked == [["later"]]  # the busy queue is still left out
            steps.enqueue(memory, [NewTask(id="t1", type="t", queue="later")])
            await runtime.woken.wait()  # work for the idle queue wakes the schedulers
            tg.cancel_scope.cancel()
    memory.close()
