"""Shutdown: drain running handlers, or cancel them and put their tasks back exactly as they were."""

from __future__ import annotations

import dataclasses
import threading

import anyio
import pytest
from gate_helpers import GUARD, eventually, make_gate

from taskgate import QueueConfig, ShutdownError, Status, Task, Throttled

pytestmark = pytest.mark.anyio


async def test_shutdown_timeout_cancels_and_requeues_without_touching_counters(gate_broker, clock):
    gate = make_gate(gate_broker, {"q": QueueConfig(workers=1)})
    started, stopped = anyio.Event(), anyio.Event()

    @gate.handler("q")
    async def long(task: Task) -> None:
        if task.throttled == 0:
            raise Throttled(retry_after=0)  # give the task a counter worth keeping
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            stopped.set()

    async with anyio.create_task_group() as tg:
        await tg.start(gate.run)
        task_id = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await started.wait()
        before = await gate.get(task_id)
        with anyio.fail_after(GUARD):
            await gate.shutdown(timeout=0.1)
        assert stopped.is_set()
    after = await gate.get(task_id)
    assert after.status is Status.PENDING
    assert (
        (after.attempts, after.throttled, after.lease_lost)
        == (before.attempts, 1, before.lease_lost)
        == (0, 1, 0)
    )
    assert after.run_at <= clock.now()
    with pytest.raises(ShutdownError):
        await gate.submit("q")


async def test_shutdown_without_timeout_lets_running_handlers_finish(gate_broker):
    gate = make_gate(gate_broker)
    started, release = anyio.Event(), anyio.Event()

    @gate.handler("q")
    async def finishes(task: Task) -> str:
        started.set()
        await release.wait()
        return "finished"

    async with anyio.create_task_group() as tg:
        await tg.start(gate.run)
        task_id = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await started.wait()
        tg.start_soon(gate.shutdown)
        await anyio.wait_all_tasks_blocked()
        assert (await gate.get(task_id)).status is Status.RUNNING
        with pytest.raises(ShutdownError):
            await gate.submit("q")
        release.set()
    assert (await gate.get(task_id)).result == b'"finished"'


async def test_a_cancelled_run_puts_its_tasks_back(gate_broker):
    gate = make_gate(gate_broker)
    started = anyio.Event()

    @gate.handler("q")
    async def long(task: Task) -> None:
        started.set()
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        await tg.start(gate.run)
        task_id = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await started.wait()
        tg.cancel_scope.cancel()
    task = await gate.get(task_id)
    assert (task.status, task.attempts, task.lease_lost) == (Status.PENDING, 0, 0)


async def test_the_context_manager_shuts_down_gracefully(gate_broker):
    gate = make_gate(gate_broker)
    gate.handle("q", lambda task: "ok")
    async with gate:
        task_id = await gate.submit("q")
        await eventually(gate, task_id, lambda t: t.status is not Status.PENDING)
    assert (await gate.get(task_id)).status is Status.COMPLETED


class _ClaimHeldOpen:
    """Wraps a broker so that `claim` waits, in its thread, until the test lets it go on."""

    def __init__(self, inner):
        self._inner = inner
        # `claim` blocks its thread, so this wrapper is not nonblocking whatever it wraps.
        self.capabilities = dataclasses.replace(inner.capabilities, nonblocking=False, inline_attempts=False)
        self.entered, self.proceed, self.done = threading.Event(), threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def claim(self, claim):
        self.entered.set()
        self.proceed.wait(GUARD)
        try:
            return self._inner.claim(claim)
        finally:
            self.done.set()


async def test_a_run_cancelled_during_a_claim_puts_the_claimed_tasks_back(gate_broker):
    broker = _ClaimHeldOpen(gate_broker)
    gate = make_gate(broker)  # type: ignore[arg-type]
    gate.handle("q", lambda task: "ran")
    task_id = await gate.submit("q")
    async with anyio.create_task_group() as tg:
        await tg.start(gate.run)
        await anyio.to_thread.run_sync(broker.entered.wait, GUARD)
        tg.cancel_scope.cancel()
        broker.proceed.set()
    await anyio.to_thread.run_sync(broker.done.wait, GUARD)
    task = await gate.get(task_id)
    # The claim finished after the runtime was cancelled: its lease must not be stranded.
    assert (task.status, task.claims, task.attempts, task.lease_lost) == (Status.PENDING, 1, 0, 0)


async def test_a_gate_whose_block_times_out_shuts_down_instead_of_hanging(gate_broker):
    """The deadline that ended the block also cancels the gate's own tasks: shutdown must not
    wait for a graceful finish that those cancelled tasks will never report."""
    gate = make_gate(gate_broker)
    started = anyio.Event()

    @gate.handler("q")
    async def forever(task: Task) -> None:
        started.set()
        await anyio.sleep_forever()

    with anyio.fail_after(GUARD):  # the guard: a hang fails here instead of stalling the run
        with anyio.move_on_after(GUARD / 3) as block:
            async with gate:
                task_id = await gate.submit("q")
                await started.wait()
                block.deadline = anyio.current_time()  # the block's own deadline passes now
                await anyio.sleep_forever()
    assert block.cancelled_caught
    assert (await gate.get(task_id)).status is Status.PENDING  # put back, as at any shutdown
