"""A gate claims only the types it has handlers for: tasks of other types wait (never failed),
run once a handler is registered, and show in `QueueStats.unhandled` once they waited long."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from gate_helpers import GUARD, Faulty, make_gate

from taskgate import ManualClock, QueueConfig, Status, Task
from taskgate.brokers.base import Broker

pytestmark = pytest.mark.anyio

ROUTES = {"known": "q", "new": "q"}


async def test_a_type_without_a_handler_waits_and_runs_once_its_handler_is_registered(
    gate_broker: Broker,
) -> None:
    gate = make_gate(gate_broker, routes=ROUTES)
    ran: list[str] = []
    gate.handle("known", lambda task: ran.append(task.type))
    async with gate:
        waiting = await gate.submit("new")
        for _ in range(3):  # claims of the queue come and go around the waiting task
            await gate.wait(await gate.submit("known"), timeout=GUARD)
        task = await gate.get(waiting)
        assert (task.status, task.claims, task.last_error) == (Status.PENDING, 0, None)
        gate.handle("new", lambda task: ran.append(task.type))  # while running: claimed from now on
        await gate.wait(waiting, timeout=GUARD)
    assert (await gate.get(waiting)).claims == 1
    assert ran == ["known", "known", "known", "new"]


async def test_a_handler_registered_while_running_starts_its_queue(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker, {"q": QueueConfig(workers=1), "other": QueueConfig(workers=1)})
    gate.handle("q", lambda task: None)
    async with gate:
        waiting = await gate.submit("other")
        gate.handle("other", lambda task: "done")
        assert await gate.wait(waiting, timeout=GUARD) == b'"done"'


async def test_a_queue_whose_due_tasks_are_all_unhandled_claims_once_per_poll_not_in_a_loop(
    gate_broker: Broker,
) -> None:
    poll = 0.05
    counting = Faulty(gate_broker)
    queues = {"q": QueueConfig(workers=2), "metered": QueueConfig(workers=2, rps=100)}
    routes = {**ROUTES, "metered-known": "metered", "metered-new": "metered"}
    gate = make_gate(counting, queues, routes=routes, poll_interval=poll)
    gate.handle("known", lambda task: None)
    gate.handle("metered-known", lambda task: None)
    async with gate:
        for task_type in ("new", "new", "metered-new"):
            await gate.submit(task_type)
        await anyio.sleep(20 * poll)  # real time: the poll interval is on the event loop's clock
    # Each of the two queues claims (and asks whether work is due) about twice per poll
    # interval -- its own poll, and the cross-process wake-up loop's -- where a spin would
    # ask thousands of times. The bound leaves twice that for a loaded machine's bursts (the
    # sleep is real time): only a spin can pass it.
    for call in ("claim", "wait_for_work"):
        assert counting.calls.get(call, 0) <= 2 * (2 * 2 * 20 + 10), counting.calls
    assert {t.status for t in await gate.list(type="new")} == {Status.PENDING}


async def test_stats_count_tasks_of_unhandled_types_due_for_longer_than_twice_the_lease(
    gate_broker: Broker, clock: ManualClock
) -> None:
    queues = {"q": QueueConfig(workers=1, lease_ttl=10)}
    worker = make_gate(gate_broker, queues, routes=ROUTES)
    worker.handle("known", lambda task: None)
    web = make_gate(gate_broker, queues, routes=ROUTES)  # no handlers: it counts every type
    for task_type in ("new", "new", "known"):
        await web.submit(task_type)
    clock.advance(timedelta(seconds=19))
    assert (await worker.stats("q")).unhandled == 0
    clock.advance(timedelta(seconds=2))
    assert (await worker.stats("q")).unhandled == 2  # "known" is the worker's own: not counted
    assert (await web.stats("q")).unhandled == 3
    await web.submit("new")  # due just now
    assert (await worker.stats("q")).unhandled == 2


async def test_a_handled_task_runs_past_unhandled_ones_submitted_before_it(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker, {"q": QueueConfig(workers=1)}, routes=ROUTES)
    done: list[Task] = []
    gate.handle("known", done.append)
    for _ in range(50):
        await gate.submit("new")
    async with gate:
        await gate.wait(await gate.submit("known"), timeout=GUARD)
    assert [t.type for t in done] == ["known"]
    assert len(await gate.list(type="new", status=Status.PENDING)) == 50
