"""Retry paths driven by what a handler raises, with broker time on a ManualClock (no real backoff)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from gate_helpers import GUARD, eventually, make_gate

from taskgate import SkipRetry, Status, Task, TaskFailedError, Throttled
from taskgate.runtime.backoff import backoff_bounds

pytestmark = pytest.mark.anyio


async def test_business_failure_retries_after_backoff_then_succeeds(gate_broker, clock):
    gate = make_gate(gate_broker, max_retry=2)
    runs: list[int] = []

    @gate.handler("q")
    async def flaky(task: Task) -> str:
        runs.append(task.attempts)
        if task.attempts == 0:
            raise ValueError("first try fails")
        return "ok"

    async with gate:
        failed_at = clock.now()
        task_id = await gate.submit("q")
        retrying = await eventually(gate, task_id, lambda t: t.status is Status.RETRYING)
        low, high = backoff_bounds(1)
        assert retrying.attempts == 1 and retrying.throttled == 0
        assert "ValueError: first try fails" in (retrying.last_error or "")
        assert failed_at + timedelta(seconds=low) <= retrying.run_at <= failed_at + timedelta(seconds=high)
        clock.advance(high)
        assert await gate.wait(task_id, timeout=GUARD) == b'"ok"'
    assert runs == [0, 1]


async def test_business_failure_beyond_max_retry_fails(gate_broker):
    gate = make_gate(gate_broker, max_retry=0)

    @gate.handler("q")
    async def broken(task: Task) -> None:
        raise RuntimeError("boom")

    async with gate:
        task_id = await gate.submit("q")
        with pytest.raises(TaskFailedError) as failed:
            await gate.wait(task_id, timeout=GUARD)
    task = failed.value.task
    assert task.status is Status.FAILED and task.attempts == 1
    assert task.last_error == "RuntimeError: boom"


async def test_throttled_requeues_after_retry_after_without_counting_attempts(gate_broker, clock):
    gate = make_gate(gate_broker, max_retry=0, throttled_max=2)
    seen: list[int] = []

    @gate.handler("q")
    async def busy(task: Task) -> None:
        seen.append(task.throttled)
        raise Throttled(retry_after=30)

    async with gate:
        start = clock.now()
        task_id = await gate.submit("q")
        first = await eventually(gate, task_id, lambda t: t.status is Status.RETRYING)
        assert (first.throttled, first.attempts) == (1, 0)
        assert first.run_at == start + timedelta(seconds=30)
        clock.advance(30)
        second = await eventually(gate, task_id, lambda t: t.throttled == 2)
        assert second.status is Status.RETRYING
        clock.advance(30)
        with pytest.raises(TaskFailedError) as failed:
            await gate.wait(task_id, timeout=GUARD)
    assert failed.value.task.throttled == 3 and failed.value.task.attempts == 0
    assert seen == [0, 1, 2]


async def test_skip_retry_fails_at_once(gate_broker):
    gate = make_gate(gate_broker, max_retry=5)

    @gate.handler("q")
    async def hopeless(task: Task) -> None:
        raise SkipRetry(KeyError("missing"))

    async with gate:
        task_id = await gate.submit("q")
        with pytest.raises(TaskFailedError) as failed:
            await gate.wait(task_id, timeout=GUARD)
    assert failed.value.task.status is Status.FAILED
    assert "SkipRetry" in (failed.value.task.last_error or "")
    assert failed.value.task.claims == 1


async def test_a_failed_parent_cancels_its_chain_unless_ignored(gate_broker):
    gate = make_gate(gate_broker)

    @gate.handler("q")
    async def parent_fails(task: Task) -> str:
        if task.json() == "parent":
            raise SkipRetry("no")
        return "child ran"

    async with gate:
        parent = await gate.submit("q", "parent")
        child = await gate.submit("q", "child", depends_on=[parent])
        tolerant = await gate.submit("q", "tolerant", depends_on=[parent], ignore_parent_failure=True)
        with pytest.raises(TaskFailedError) as canceled:
            await gate.wait(child, timeout=GUARD)
        assert await gate.wait(tolerant, timeout=GUARD) == b'"child ran"'
    assert canceled.value.task.status is Status.CANCELED
