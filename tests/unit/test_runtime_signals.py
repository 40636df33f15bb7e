"""Runtime plumbing without a broker: signals, waiters, the hook dispatcher, the broker door."""

from __future__ import annotations

import logging
import math
import threading
from datetime import UTC, datetime

import anyio
import pytest

from taskgate import BrokerError, Status, Task
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.hooks import HookDispatcher
from taskgate.runtime.signals import Alarm, Signal, TaskWaiters

pytestmark = pytest.mark.anyio

NOW = datetime(2030, 1, 1, tzinfo=UTC)
TASK = Task(id="01A", type="t", queue="q", payload=None, status=Status.PENDING, created_at=NOW, run_at=NOW)


async def test_a_fire_before_the_wait_is_remembered():
    signal = Signal()
    signal.fire()
    assert await signal.wait(10) is True
    assert await signal.wait(0) is False


async def test_a_fire_during_the_wait_wakes_it():
    signal = Signal()
    async with anyio.create_task_group() as tg:
        tg.start_soon(signal.wait, None)
        await anyio.wait_all_tasks_blocked()
        signal.fire()


async def _sleeper(alarm: Alarm, deadline: float, woke: list[float]) -> None:
    await alarm.sleep_until(deadline)
    woke.append(anyio.current_time())


async def test_an_alarm_brought_forward_ends_the_sleep_without_waking_it_before():
    alarm, woke = Alarm(), []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_sleeper, alarm, math.inf, woke)
        await anyio.wait_all_tasks_blocked()
        alarm.ring_by(anyio.current_time() + 3600)
        await anyio.wait_all_tasks_blocked()
        assert woke == []  # brought forward, not woken: it sleeps until then
        ring_at = anyio.current_time()
        alarm.ring_by(ring_at)
    assert len(woke) == 1 and woke[0] >= ring_at


async def test_a_later_time_does_not_put_an_alarm_back():
    alarm, woke = Alarm(), []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_sleeper, alarm, math.inf, woke)
        await anyio.wait_all_tasks_blocked()
        alarm.ring_by(anyio.current_time())
        alarm.ring_by(math.inf)
    assert len(woke) == 1


async def test_bringing_forward_an_alarm_nobody_sleeps_on_changes_no_later_sleep():
    alarm, woke = Alarm(), []
    alarm.ring_by(anyio.current_time())
    async with anyio.create_task_group() as tg:
        tg.start_soon(_sleeper, alarm, math.inf, woke)
        await anyio.wait_all_tasks_blocked()
        assert woke == []
        tg.cancel_scope.cancel()
    assert woke == []


async def test_waiters_are_woken_by_their_task_or_by_everyone():
    waiters = TaskWaiters()
    one, two = waiters.add("a"), waiters.add("b")
    waiters.notify("a")
    assert one.is_set() and not two.is_set()
    waiters.notify_all()
    assert two.is_set()


async def test_hook_exceptions_are_logged_and_swallowed(caplog):
    def broken(task: Task) -> None:
        raise RuntimeError("hook bug")

    dispatcher = HookDispatcher(broken)
    caplog.set_level(logging.ERROR, logger="taskgate")
    async with anyio.create_task_group() as tg:
        await tg.start(dispatcher.run)
        await dispatcher.emit([TASK, TASK])
        dispatcher.close()
    assert [r.message for r in caplog.records].count(
        "on_state_change hook raised for task 01A (pending); ignored"
    ) == 2


async def test_a_hung_broker_call_becomes_a_broker_error_at_its_deadline():
    calls = BrokerCalls(2)
    release = threading.Event()
    with pytest.raises(BrokerError, match="wait"):
        await calls(release.wait, 30, deadline=0.05)
    release.set()
    assert await calls(lambda x, *, y: x + y, 1, y=2) == 3
