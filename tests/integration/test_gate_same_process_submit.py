"""A submit in the process that runs its queue: stored, then claimed by the queue's woken scheduler.

No polling delay (the submit fires the queue's `Signal`), no more leases than free workers,
and a caller giving up on its submit does not lose the task.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from gate_helpers import GUARD, Faulty, make_gate, until

from taskgate import BrokerError, QueueConfig, Status, Task
from taskgate.brokers.base import Broker
from taskgate.brokers.params import Submit, Submitted

pytestmark = pytest.mark.anyio

NEVER = 3600.0  # a poll interval no test outlives: only the submit's wake-up can start a task


class Held(Faulty):
    """Storing tasks waits in its thread until ``release`` is set (then runs for real; `stored`
    is set once it did).

    Its calls always go to a thread (an inline broker's would block the event loop).
    """

    def __init__(self, inner: Broker) -> None:
        super().__init__(inner, replace(inner.capabilities, nonblocking=False, inline_attempts=False))
        self.entered, self.release, self.stored = threading.Event(), threading.Event(), threading.Event()
        self.ids: list[str] = []

    def submit(self, submit: Submit) -> Submitted:
        self.ids.extend(task.id for task in submit.tasks)
        self.entered.set()
        assert self.release.wait(GUARD), "the test never released the submit"
        try:
            return self._inner.submit(submit)
        finally:
            self.stored.set()


async def test_a_task_submitted_in_process_starts_without_waiting_for_the_poll(gate_broker):
    started = anyio.Event()
    gate = make_gate(gate_broker, poll_interval=NEVER)

    @gate.handler("q")
    async def start(task: Task) -> None:  # async: an `anyio.Event` is set on the event loop
        started.set()

    async with gate:
        await until(lambda: _idle(gate))  # the first claim found nothing: the next waits a poll
        await gate.submit("q")
        with anyio.fail_after(GUARD):
            await started.wait()


async def test_a_failing_claim_leaves_the_submit_standing(gate_broker):
    broker = Faulty(gate_broker)
    gate = make_gate(broker)
    gate.handle("q", lambda task: "ran")
    async with gate:
        await until(lambda: _idle(gate))
        broker.failing["claim"] = BrokerError("claims are down")
        task_id = await gate.submit("q")  # stored, though the claim it wakes fails
        assert (await gate.get(task_id)).status is Status.PENDING
        del broker.failing["claim"]
        assert await gate.wait(task_id, timeout=GUARD) == b'"ran"'


async def test_racing_submits_lease_no_more_tasks_than_there_are_free_workers(gate_broker):
    running, peak = 0, 0
    release = anyio.Event()

    async def handler(task: Task) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    gate = make_gate(gate_broker, {"q": QueueConfig(workers=3)})
    gate.handle("q", handler)
    async with gate:
        await until(lambda: _idle(gate))
        ids: list[str] = []

        async def submit() -> None:
            ids.append(await gate.submit("q"))

        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(submit)
        await until(lambda: _settled(lambda: running == 3))
        # The rest wait pending in the store, not leased to workers that cannot take them.
        assert (await gate.overview())["q"] == {Status.RUNNING: 3, Status.PENDING: 9}
        release.set()
        for task_id in ids:
            await gate.wait(task_id, timeout=GUARD)
    assert peak == 3


async def test_a_submit_cancelled_while_it_stores_returns_at_once_and_its_task_still_runs(gate_broker):
    held = Held(gate_broker)
    gate = make_gate(held)
    gate.handle("q", lambda task: "ran")
    async with gate:
        await until(lambda: _idle(gate))
        gave_up, scope = anyio.Event(), anyio.CancelScope()

        async def submit() -> None:
            with scope:
                await gate.submit("q")
            gave_up.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(submit)
                await anyio.to_thread.run_sync(held.entered.wait, GUARD)
                scope.cancel()  # the submit's caller gives up while the broker call runs
                with anyio.fail_after(GUARD):
                    await gave_up.wait()  # at once: it does not wait for the call to answer
        finally:
            held.release.set()  # the call goes on and stores the task; the poll finds it
        assert await anyio.to_thread.run_sync(held.stored.wait, GUARD)
        (task_id,) = held.ids
        assert await gate.wait(task_id, timeout=GUARD) == b'"ran"'
        done = await gate.get(task_id)
    assert (done.claims, done.lease_lost) == (1, 0)


async def _idle(gate) -> bool:  # type: ignore[no-untyped-def]
    """The gate's queue ``q`` made its first claim and found nothing (as after start-up)."""
    scheduler = gate._runtime.schedulers.get("q")
    return scheduler is not None and scheduler.idle and scheduler._claim_started > 0


async def _settled(check) -> bool:  # type: ignore[no-untyped-def]
    await anyio.lowlevel.checkpoint()
    return bool(check())
