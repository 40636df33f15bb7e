"""`taskgate.set_progress` inside a handler stores a JSON value that `Task.progress` reads from
the store, on all five backends; outside a handler, or with a value it cannot store, it
raises and stores nothing."""

from __future__ import annotations

import math

import anyio
import pytest
from gate_helpers import GUARD, eventually, make_gate

import taskgate
from taskgate import NoTaskError, QueueConfig, Status, Task
from taskgate.brokers.base import Broker
from taskgate.runtime import set_progress_sync

pytestmark = pytest.mark.anyio

QUEUES = {"q": QueueConfig(workers=2, lease_ttl="1h")}


async def test_a_handler_reports_progress_that_a_reader_of_the_store_sees(broker: Broker) -> None:
    gate = make_gate(broker, QUEUES)
    halfway, finish = anyio.Event(), anyio.Event()

    @gate.handler("q")
    async def work(task: Task) -> str:
        await taskgate.set_progress({"done": 5, "of": 10})
        halfway.set()
        await finish.wait()
        await taskgate.set_progress({"done": 10, "of": 10})
        return "ok"

    reader = make_gate(broker, QUEUES)  # a web process: reads the store, runs nothing
    async with gate:
        task_id = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await halfway.wait()
        seen = await reader.get(task_id)
        assert seen.status is Status.RUNNING and seen.progress == {"done": 5, "of": 10}
        finish.set()
        await gate.wait(task_id, timeout=GUARD)
    assert (await reader.get(task_id)).progress == {"done": 10, "of": 10}


async def test_a_sync_handler_reports_progress_too(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker, QUEUES)

    @gate.handler("q")
    def work(task: Task) -> None:
        set_progress_sync(["step", 1])

    async with gate:
        task_id = await gate.submit("q")
        await gate.wait(task_id, timeout=GUARD)
    assert (await gate.get(task_id)).progress == ["step", 1]


async def test_set_progress_outside_a_handler_raises_no_task_error() -> None:
    with pytest.raises(NoTaskError, match=r"set_progress\(\) must be called from inside"):
        await taskgate.set_progress(1)


@pytest.mark.parametrize(
    ("value", "error", "says"),
    [
        ("x" * (64 * 1024), ValueError, "at most 65536"),
        ({1, 2}, TypeError, "JSON-encodable"),
        (math.nan, ValueError, "JSON-encodable"),
        (b"raw", TypeError, "JSON-encodable"),
    ],
)
async def test_a_value_that_cannot_be_stored_raises_in_the_handler_and_stores_nothing(
    gate_broker: Broker, value: object, error: type[Exception], says: str
) -> None:
    gate = make_gate(gate_broker, QUEUES)
    raised: list[BaseException] = []

    @gate.handler("q")
    async def work(task: Task) -> None:
        try:
            await taskgate.set_progress(value)
        except Exception as exc:
            raised.append(exc)

    async with gate:
        task_id = await gate.submit("q")
        task = await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED)
    assert len(raised) == 1 and isinstance(raised[0], error) and says in str(raised[0])
    assert task.progress is None
