"""Work queued by another process reaches a gate whose queue went idle after a busy spell."""

from __future__ import annotations

import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

import anyio
import pytest
from gate_helpers import GUARD, eventually, make_gate, until

from taskgate import QueueConfig, Status, Task
from taskgate.brokers.sql import SQLBroker
from taskgate.runtime import wakeups
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task

pytestmark = pytest.mark.anyio


class Asking:
    """A real SQLite broker counting the ``wait_for_work`` calls running right now."""

    def __init__(self, inner: SQLBroker) -> None:
        self._inner = inner
        self.capabilities = inner.capabilities
        self.in_flight = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def wait_for_work(self, queues: Collection[str], timeout: float) -> bool:
        with self._lock:
            self.in_flight += 1
        try:
            return self._inner.wait_for_work(queues, timeout)
        finally:
            with self._lock:
                self.in_flight -= 1


async def test_a_queue_idle_again_after_a_full_claim_hears_of_another_processes_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wakeups, "FIRST_PAUSE", 0.0)  # the loop decides again at once
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    mine, other_process = SQLBroker(url, poll_interval=0.05), SQLBroker(url)
    broker = Asking(mine)
    # Neither the scheduler's own poll nor the wake-up loop's safety net comes round within
    # the test: only the queue turning idle can make the loop ask for the other process's work.
    gate = make_gate(broker, {"q": QueueConfig(workers=2)}, poll_interval=60.0, routes={"t": "q"})  # type: ignore[arg-type]
    started, release = [anyio.Event(), anyio.Event()], anyio.Event()
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id)
        if len(ran) <= len(started):
            started[len(ran) - 1].set()
            await release.wait()

    gate.handle("t", handler)
    busy = steps.enqueue(mine, [new_task(), new_task()])  # the first claim takes both: a full claim
    try:
        with anyio.fail_after(GUARD):
            async with gate:
                for event in started:
                    await event.wait()

                async def no_ask_running() -> bool:
                    return broker.in_flight == 0

                await until(no_ask_running)
                await anyio.wait_all_tasks_blocked()
                assert broker.in_flight == 0  # parked: the only queue is busy
                release.set()
                for task in busy:
                    await eventually(gate, task.id, lambda t: t.status is Status.COMPLETED)
                (later,) = steps.enqueue(other_process, [new_task()])
                await eventually(gate, later.id, lambda t: t.status is Status.COMPLETED)
        assert sorted(ran) == sorted([*(task.id for task in busy), later.id])
    finally:
        other_process.close()
        mine.close()
