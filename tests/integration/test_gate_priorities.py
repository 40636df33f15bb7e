"""`Gate.submit(..., priority=)` on every backend: a queue runs its due tasks highest priority
first, then oldest due; a bad priority raises naming it and stores nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from gate_helpers import GUARD, make_gate

from taskgate import ManualClock, QueueConfig
from taskgate.brokers.base import Broker

pytestmark = pytest.mark.anyio


async def test_a_queue_runs_its_due_tasks_by_priority_then_by_age(broker: Broker, clock: ManualClock) -> None:
    gate = make_gate(broker, {"q": QueueConfig(workers=1)})
    ran: list[str] = []
    gate.handle("q", lambda task: ran.append(task.json()))
    await gate.submit("q", "low-old")
    clock.advance(timedelta(seconds=1))
    await gate.submit_many("q", ["high-1", "high-2"], priority=7)
    await gate.submit("q", "later-top", priority=100, delay=timedelta(hours=1))
    await gate.submit("q", "negative", priority=-5)
    await gate.submit("q", "low-new")
    await gate.submit("q", "mid", priority=3)
    last = await gate.submit("q", "last", priority=-6)
    async with gate:
        await gate.wait(last, timeout=GUARD)
    assert ran == ["high-1", "high-2", "mid", "low-old", "low-new", "negative", "last"]
    assert [t.priority for t in await gate.list(type="q", status="pending")] == [100]


async def test_a_tasks_priority_is_in_its_snapshots_as_it_runs_and_once_done(broker: Broker) -> None:
    gate = make_gate(broker, {"q": QueueConfig(workers=1)})
    seen: list[int] = []
    gate.handle("q", lambda task: seen.append(task.priority))
    task_id = await gate.submit("q", priority=2)
    assert (await gate.get(task_id)).priority == 2
    async with gate:
        await gate.wait(task_id, timeout=GUARD)
    assert seen == [2]
    assert (await gate.get(task_id)).priority == 2


@pytest.mark.parametrize(
    ("priority", "error"),
    [(True, TypeError), ("high", TypeError), (2**31, ValueError), (-(2**31) - 1, ValueError)],
)
async def test_a_bad_priority_raises_naming_it_and_stores_nothing(
    broker: Broker, priority: object, error: type[Exception]
) -> None:
    gate = make_gate(broker)
    with pytest.raises(error, match="priority"):
        await gate.submit("q", priority=priority)  # type: ignore[arg-type]
    with pytest.raises(error, match="priority"):
        await gate.submit_many("q", [1, 2], priority=priority)  # type: ignore[arg-type]
    assert await gate.list() == []
