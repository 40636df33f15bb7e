"""A submit whose queue has an idle worker here claims in the same broker call.

A `SubmitClaimer` (memory, SQL) leases the task in the submit's own step; any other broker
(seen here through a wrapper that hides the capability, as Redis has none) stores the task and
claims right after it in the same thread.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from gate_helpers import GUARD, Faulty, eventually, make_gate, until

from taskgate import BrokerError, QueueConfig, Status, Task
from taskgate.brokers.base import Broker, Lease, NewTask

pytestmark = pytest.mark.anyio


class Held(Faulty):
    """`enqueue_and_claim` waits in its thread until ``release`` is set (then runs for real).

    Its calls always go to a thread (an inline broker's would block the event loop).
    """

    def __init__(self, inner: Broker) -> None:
        super().__init__(inner, replace(inner.capabilities, nonblocking=False, inline_attempts=False))
        self.entered, self.release = threading.Event(), threading.Event()
        self.ids: list[str] = []

    def enqueue_and_claim(self, task: NewTask, lease_ttl: object) -> tuple[Task, Lease | None]:
        self.ids.append(task.id)
        self.entered.set()
        assert self.release.wait(GUARD), "the test never released enqueue_and_claim"
        return self._inner.enqueue_and_claim(task, lease_ttl)  # type: ignore[attr-defined,no-any-return]


async def test_a_task_submitted_to_an_idle_queue_starts_without_a_claim_of_its_own(gate_broker):
    spy = Faulty(gate_broker)
    claims_at_start: list[int] = []
    gate = make_gate(spy, poll_interval=GUARD)  # no polling claim comes between
    gate.handle("q", lambda task: claims_at_start.append(spy.calls.get("claim", 0)))
    async with gate:
        await until(lambda: _idle(gate))
        claims_before = spy.calls["claim"]
        task_id = await gate.submit("q")
        done = await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED)
    assert spy.calls["enqueue_and_claim"] == 1 and done.claims == 1
    assert claims_at_start == [claims_before]  # no claim ran between submit and start


@pytest.fixture(params=["submit-claimer", "enqueue-then-claim"])
def claiming_broker(request: pytest.FixtureRequest, gate_broker: Broker) -> Broker:
    """``gate_broker`` as it is, or hiding ``claim_on_submit`` (the enqueue-then-claim path)."""
    if request.param == "submit-claimer":
        return gate_broker
    return Faulty(gate_broker, replace(gate_broker.capabilities, claim_on_submit=False))


async def test_without_submit_claimer_the_submit_claims_before_it_returns(gate_broker):
    events: list[str] = []

    class Traced(Faulty):
        def __getattr__(self, name: str) -> object:
            call = super().__getattr__(name)
            if name not in ("enqueue", "claim"):
                return call

            def traced(*args: object, **kwargs: object) -> object:
                events.append(name)
                return call(*args, **kwargs)  # type: ignore[operator]

            return traced

    broker = Traced(gate_broker, replace(gate_broker.capabilities, nonblocking=False, claim_on_submit=False))
    gate = make_gate(broker, poll_interval=GUARD)  # no polling claim comes between
    gate.handle("q", lambda task: None)
    async with gate:
        await until(lambda: _idle(gate))
        del events[:]
        task_id = await gate.submit("q")
        events.append("returned")
        done = await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED)
    assert done.claims == 1
    # The claim ran in the submit's own broker call: without it, the scheduler would claim
    # only once the submit had returned and woken it.
    assert events[:3] == ["enqueue", "claim", "returned"]


async def test_a_claim_failing_after_a_submit_leaves_the_submit_standing(gate_broker):
    broker = Faulty(gate_broker, replace(gate_broker.capabilities, claim_on_submit=False))
    gate = make_gate(broker)
    gate.handle("q", lambda task: "ran")
    async with gate:
        await until(lambda: _idle(gate))
        broker.failing["claim"] = BrokerError("claims are down")
        task_id = await gate.submit("q")  # stored, though its claim failed
        assert (await gate.get(task_id)).status is Status.PENDING
        del broker.failing["claim"]
        assert await gate.wait(task_id, timeout=GUARD) == b'"ran"'


async def test_racing_submits_lease_no_more_tasks_than_there_are_free_workers(claiming_broker):
    running, peak = 0, 0
    release = anyio.Event()

    async def handler(task: Task) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    gate = make_gate(claiming_broker, {"q": QueueConfig(workers=3)})
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


async def test_a_submit_cancelled_while_it_claims_returns_at_once_and_its_task_still_runs(gate_broker):
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
            held.release.set()  # the call goes on: it stores the task and claims it
        await until(lambda: _settled(lambda: held.calls.get("requeue", 0) == 1))  # put back
        (task_id,) = held.ids
        assert await gate.wait(task_id, timeout=GUARD) == b'"ran"'
        done = await gate.get(task_id)
    assert (done.claims, done.lease_lost) == (2, 0)  # the abandoned claim, put back, then the run


async def test_a_lease_coming_back_after_the_workers_stopped_is_put_back(gate_broker):
    held = Held(gate_broker)
    gate = make_gate(held)
    gate.handle("q", lambda task: None)
    async with anyio.create_task_group() as tg:
        await tg.start(gate.run)
        await until(lambda: _idle(gate))
        tg.start_soon(gate.submit, "q")
        await anyio.to_thread.run_sync(held.entered.wait, GUARD)
        with anyio.fail_after(GUARD):
            await gate.shutdown()  # no running task: the workers stop at once
        held.release.set()
    (task_id,) = held.ids
    task = await eventually(gate, task_id, lambda t: t.status is not Status.RUNNING)
    assert (task.status, task.claims) == (Status.PENDING, 1)  # requeued, not left to the reaper


async def test_a_metered_queue_claims_the_usual_way(gate_broker):
    spy = Faulty(gate_broker)
    gate = make_gate(spy, {"q": QueueConfig(workers=2, rps=1000)})
    gate.handle("q", lambda task: None)
    async with gate:
        await until(lambda: _started(gate))  # idle: a metered queue only asks whether work is due
        await gate.wait(await gate.submit("q"), timeout=GUARD)
    assert "enqueue_and_claim" not in spy.calls


async def _started(gate) -> bool:  # type: ignore[no-untyped-def]
    scheduler = gate._runtime.schedulers.get("q")
    return scheduler is not None and scheduler._started and scheduler.idle


async def _idle(gate) -> bool:  # type: ignore[no-untyped-def]
    """The gate's queue ``q`` made its first claim and found nothing (as after start-up)."""
    scheduler = gate._runtime.schedulers.get("q")
    if scheduler is None or not scheduler._started or scheduler._claiming:
        return False
    return scheduler.idle and scheduler._claim_started > 0  # a claim ran and found too little


async def _settled(check) -> bool:  # type: ignore[no-untyped-def]
    await anyio.lowlevel.checkpoint()
    return bool(check())
