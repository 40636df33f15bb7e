"""`Config(middleware=[...])` wraps every handler run, the first middleware outermost; raising
before ``call_next`` vetoes the run with the outcome the handler raising it would have had. On
all five backends, each with the test's `ManualClock` (a throttled task stays retrying)."""

from __future__ import annotations

from typing import Any

import pytest
from gate_helpers import GUARD, eventually, make_gate

from taskgate import ConfigError, QueueConfig, SkipRetry, Status, Task, Throttled
from taskgate.brokers.base import Broker
from taskgate.brokers.memory import MemoryBroker
from taskgate.middleware import CallNext

pytestmark = pytest.mark.anyio

QUEUES = {"q": QueueConfig(workers=1, lease_ttl="1h")}


def recording(name: str, seen: list[str]) -> Any:
    async def middleware(task: Task, call_next: CallNext) -> Any:
        seen.append(f"{name} before {task.type}")
        value = await call_next()
        seen.append(f"{name} after")
        return {name: value}

    return middleware


async def test_middleware_wraps_the_handler_in_order_the_first_outermost(broker: Broker) -> None:
    seen: list[str] = []
    gate = make_gate(broker, QUEUES, middleware=[recording("outer", seen), recording("inner", seen)])

    @gate.handler("q")
    async def work(task: Task) -> str:
        seen.append("handler")
        return "done"

    async with gate:
        task_id = await gate.submit("q")
        result = await gate.wait_json(task_id, timeout=GUARD)
    assert seen == ["outer before q", "inner before q", "handler", "inner after", "outer after"]
    assert result == {"outer": {"inner": "done"}}


async def test_middleware_wraps_a_sync_handler_with_a_timeout_too(broker: Broker) -> None:
    seen: list[str] = []
    gate = make_gate(broker, QUEUES, middleware=[recording("only", seen)])

    @gate.handler("q")
    def work(task: Task) -> int:
        return 7

    async with gate:
        task_id = await gate.submit("q", timeout="1h")
        assert await gate.wait_json(task_id, timeout=GUARD) == {"only": 7}
    assert seen == ["only before q", "only after"]


def vetoing(exc: BaseException) -> Any:
    async def veto(task: Task, call_next: CallNext) -> Any:
        raise exc

    return veto


async def run_vetoed(broker: Broker, exc: Exception, status: Status, **submit: Any) -> Task:
    ran: list[str] = []
    gate = make_gate(broker, QUEUES, middleware=[vetoing(exc)])

    @gate.handler("q")
    async def work(task: Task) -> None:
        ran.append(task.id)

    async with gate:
        task_id = await gate.submit("q", **submit)
        task = await eventually(gate, task_id, lambda t: t.status is status)
    assert ran == []
    return task


async def test_skip_retry_before_call_next_fails_the_task_without_running_it(broker: Broker) -> None:
    task = await run_vetoed(broker, SkipRetry("not today"), Status.FAILED, max_retry=3)
    assert task.last_error == "SkipRetry: not today" and task.throttled == 0


async def test_throttled_before_call_next_requeues_the_task_as_throttled(broker: Broker) -> None:
    task = await run_vetoed(broker, Throttled(60, "gateway busy"), Status.RETRYING)
    assert task.throttled == 1 and task.attempts == 0 and task.last_error == "Throttled: gateway busy"


async def test_any_exception_before_call_next_counts_a_business_failure(broker: Broker) -> None:
    task = await run_vetoed(broker, PermissionError("tenant suspended"), Status.FAILED)
    assert task.attempts == 1 and task.last_error == "PermissionError: tenant suspended"
    assert task.last_traceback is not None and "veto" in task.last_traceback


async def test_a_middleware_that_is_not_a_coroutine_function_is_refused_by_name() -> None:
    def log_it(task: Task, call_next: CallNext) -> Any:
        return call_next()

    with pytest.raises(ConfigError, match=r"middleware\[1\] = .*log_it is not a coroutine function"):
        make_gate(MemoryBroker(), QUEUES, middleware=[recording("ok", []), log_it])
