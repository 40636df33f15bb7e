"""`taskgate.step` inside a handler: a step's work is done once per task, its JSON result stored
on the broker and handed to every later run (a retry here; a crash in tests/e2e/test_steps.py),
on all five backends; `Task.first_run` tells the first claim from the others."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import anyio.lowlevel
import pytest
from gate_helpers import GUARD, Faulty, eventually, make_gate

import taskgate
from taskgate import BrokerError, ManualClock, NoTaskError, QueueConfig, Status, Task
from taskgate.brokers.base import Broker
from taskgate.brokers.params import Step
from taskgate.runtime import step_sync

pytestmark = pytest.mark.anyio

QUEUES = {"q": QueueConfig(workers=2, lease_ttl="1h")}


async def _retried(gate: taskgate.Gate, clock: ManualClock, task_id: str) -> bytes | None:
    """Wait for ``task_id``'s retry, move the clock past its back-off, and wait for its result."""
    await eventually(gate, task_id, lambda t: t.status is Status.RETRYING)
    clock.advance(timedelta(hours=1))
    return await gate.wait(task_id, timeout=GUARD)


async def test_a_retry_gets_a_steps_stored_result_without_calling_it_again(
    broker: Broker, clock: ManualClock
) -> None:
    gate = make_gate(broker, QUEUES, max_retry=1)
    charged: list[int] = []
    shipped: list[str] = []
    first_runs: list[bool] = []

    def charge(amount: int) -> tuple[str, int]:
        charged.append(amount)
        return ("receipt", amount)

    async def ship(receipt: list[Any]) -> str:
        await anyio.lowlevel.checkpoint()
        shipped.append(receipt[0])
        return f"shipped {receipt[1]}"

    @gate.handler("q")
    async def order(task: Task) -> list[Any]:
        first_runs.append(task.first_run)
        receipt = await taskgate.step("charge", charge, 42)
        if task.first_run:
            raise ConnectionError("the warehouse is down")
        return [receipt, await taskgate.step("ship", ship, receipt)]

    async with gate:
        task_id = await gate.submit("q")
        result = await _retried(gate, clock, task_id)
    assert result == b'[["receipt",42],"shipped 42"]'  # a tuple comes back a list, on every run
    assert charged == [42] and shipped == ["receipt"]
    assert first_runs == [True, False]
    assert broker.step(Step(task_id, "charge")) == b'["receipt",42]'


async def test_a_name_used_again_in_one_run_with_equal_arguments_answers_the_same_result(
    broker: Broker,
) -> None:
    gate = make_gate(broker, QUEUES)
    calls: list[str] = []

    def lookup(key: str, *, fresh: bool = False) -> dict[str, str]:
        calls.append(key)
        return {"key": key}

    @gate.handler("q")
    async def work(task: Task) -> list[Any]:
        first = await taskgate.step("lookup", lookup, "a", fresh=True)
        again = await taskgate.step("lookup", lookup, "a", fresh=True)
        with pytest.raises(
            ValueError, match="step 'lookup' was already run in this run with other arguments"
        ):
            await taskgate.step("lookup", lookup, "b")
        return [first, again, first is again]

    async with gate:
        task_id = await gate.submit("q")
        result = await gate.wait_json(task_id, timeout=GUARD)
    assert result == [{"key": "a"}, {"key": "a"}, False]  # decoded afresh: changing one leaves the other
    assert calls == ["a"]


@pytest.mark.parametrize(
    ("value", "error"),
    [({1, 2}, TypeError), (b"raw", TypeError), (math.nan, ValueError), ("x" * (1024 * 1024), ValueError)],
)
async def test_a_result_that_cannot_be_stored_raises_naming_the_step_and_stores_nothing(
    broker: Broker, value: object, error: type[Exception]
) -> None:
    gate = make_gate(broker, QUEUES)
    raised: list[BaseException] = []

    @gate.handler("q")
    async def work(task: Task) -> None:
        try:
            await taskgate.step("odd", lambda: value)
        except Exception as exc:
            raised.append(exc)

    async with gate:
        task_id = await gate.submit("q")
        await gate.wait(task_id, timeout=GUARD)
    assert len(raised) == 1 and isinstance(raised[0], error) and "step 'odd'" in str(raised[0])
    assert broker.step(Step(task_id, "odd")) is None


async def test_what_a_step_raises_fails_the_run_and_stores_nothing(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker, QUEUES, max_retry=0)

    def refuse() -> None:
        raise PermissionError("card declined")

    @gate.handler("q")
    async def work(task: Task) -> None:
        await taskgate.step("charge", refuse)

    async with gate:
        task_id = await gate.submit("q")
        failed = await eventually(gate, task_id, lambda t: t.status is Status.FAILED)
    assert failed.last_error == "PermissionError: card declined"
    assert gate_broker.step(Step(task_id, "charge")) is None


async def test_a_broker_error_storing_a_step_fails_the_run_which_is_retried(
    gate_broker: Broker, clock: ManualClock
) -> None:
    broker = Faulty(gate_broker)
    broker.failing["step"] = BrokerError("the store is down")
    gate = make_gate(broker, QUEUES, max_retry=1)
    calls: list[int] = []

    def count() -> int:
        calls.append(1)
        return len(calls)

    @gate.handler("q")
    async def work(task: Task) -> int:
        if not task.first_run:
            broker.failing.clear()  # the store is back
        return int(await taskgate.step("count", count))

    async with gate:
        task_id = await gate.submit("q")
        retrying = await eventually(gate, task_id, lambda t: t.status is Status.RETRYING)
        assert retrying.last_error == "BrokerError: the store is down"
        clock.advance(timedelta(hours=1))
        assert await gate.wait_json(task_id, timeout=GUARD) == 2  # nothing was stored: run again
    assert calls == [1, 1]


async def test_a_bad_step_name_or_fn_is_refused_before_anything_runs(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker, QUEUES)
    raised: list[str] = []

    @gate.handler("q")
    async def work(task: Task) -> None:
        for name, fn in (("", print), ("n\x00", print), ("ok", "not callable")):
            try:
                await taskgate.step(name, fn)  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                raised.append(str(exc))

    async with gate:
        await gate.wait(await gate.submit("q"), timeout=GUARD)
    assert raised[0] == "step name must not be empty"
    assert raised[1].startswith("step name must not contain NUL")
    assert raised[2].startswith("step 'ok' needs a callable")


async def test_a_sync_handler_uses_step_sync_with_plain_and_async_functions(
    gate_broker: Broker, clock: ManualClock
) -> None:
    gate = make_gate(gate_broker, QUEUES, max_retry=1)
    calls: list[str] = []

    def plain() -> int:
        calls.append("plain")
        return 1

    async def coroutine() -> int:
        calls.append("async")
        return 2

    @gate.handler("q")
    def work(task: Task) -> int:
        total = step_sync("plain", plain) + step_sync("async", coroutine)
        if task.first_run:
            raise ConnectionError("try again")
        return int(total)

    async with gate:
        task_id = await gate.submit("q")
        assert await _retried(gate, clock, task_id) == b"3"
    assert calls == ["plain", "async"]


async def test_step_outside_a_handler_raises_naming_it() -> None:
    with pytest.raises(NoTaskError, match=r"taskgate\.step\(\) must be called from inside"):
        await taskgate.step("charge", print)
    with pytest.raises(RuntimeError, match=r"taskgate\.step_sync\(\) must be called from inside"):
        step_sync("charge", print)
