"""A handler's `retry_if` and `Backoff`, and a queue's `Backoff`, on every backend; broker time
on a ManualClock, so no retry waits for real."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from gate_helpers import GUARD, eventually, make_gate

from taskgate import Backoff, ConfigError, QueueConfig, Status, Task, TaskFailedError

pytestmark = pytest.mark.anyio


async def test_a_handlers_backoff_sets_when_its_task_runs_again(broker, clock):
    gate = make_gate(broker, max_retry=2)
    runs: list[int] = []

    def flaky(task: Task) -> str:
        runs.append(task.attempts)
        if task.attempts < 2:
            raise ConnectionError("gateway reset")
        return "ok"

    gate.handle("q", flaky, backoff=Backoff(base="10s", factor=3, jitter=0))
    async with gate:
        start = clock.now()
        task_id = await gate.submit("q")
        first = await eventually(gate, task_id, lambda t: t.status is Status.RETRYING)
        assert first.run_at == start + timedelta(seconds=30)  # 10 s * 3**1, no jitter
        clock.advance(30)
        second = await eventually(gate, task_id, lambda t: t.attempts == 2)
        assert second.status is Status.RETRYING and second.run_at == start + timedelta(seconds=30 + 90)
        clock.advance(90)
        assert await gate.wait_json(task_id, timeout=GUARD) == "ok"
    assert runs == [0, 1, 2]


async def test_retry_if_false_fails_the_task_at_once_and_true_retries_it(broker, clock):
    gate = make_gate(broker, max_retry=3)

    @gate.handler(
        "q", retry_if=lambda exc: isinstance(exc, ConnectionError), backoff=Backoff(base=1, jitter=0)
    )
    async def picky(task: Task) -> None:
        raise (ConnectionError if task.json() == "transient" else ValueError)("no")

    async with gate:
        permanent = await gate.submit("q", "permanent")
        with pytest.raises(TaskFailedError) as failed:
            await gate.wait(permanent, timeout=GUARD)
        assert (failed.value.task.status, failed.value.task.attempts) == (Status.FAILED, 1)
        assert failed.value.task.last_error == "ValueError: no"

        transient = await gate.submit("q", "transient")
        retrying = await eventually(gate, transient, lambda t: t.status is Status.RETRYING)
        assert retrying.attempts == 1 and retrying.run_at == clock.now() + timedelta(seconds=2)


async def test_a_queues_backoff_serves_handlers_without_one_and_a_handlers_own_wins(broker, clock):
    queues = {"q": QueueConfig(workers=2, backoff=Backoff(base="5s", factor=1, jitter=0))}
    gate = make_gate(broker, queues, routes={"plain": "q", "own": "q"}, max_retry=1)

    def broken(task: Task) -> None:
        raise RuntimeError("boom")

    gate.handle("plain", broken)
    gate.handle("own", broken, backoff=Backoff(base="20s", factor=1, jitter=0))
    async with gate:
        start = clock.now()
        plain, own = await gate.submit("plain"), await gate.submit("own")
        for task_id, wait in ((plain, 5), (own, 20)):
            retrying = await eventually(gate, task_id, lambda t: t.status is Status.RETRYING)
            assert retrying.run_at == start + timedelta(seconds=wait)


async def test_a_retry_if_that_raises_fails_the_task_and_is_logged(gate_broker, caplog):
    gate = make_gate(gate_broker, max_retry=3)

    def broken_predicate(exc: Exception) -> bool:
        raise LookupError("predicate bug")

    @gate.handler("q", retry_if=broken_predicate)
    async def failing(task: Task) -> None:
        raise ValueError("bad input")

    with caplog.at_level(logging.ERROR, logger="taskgate"):
        async with gate:
            task_id = await gate.submit("q")
            with pytest.raises(TaskFailedError) as failed:
                await gate.wait(task_id, timeout=GUARD)
    assert failed.value.task.attempts == 1 and failed.value.task.last_error == "ValueError: bad input"
    assert any("retry_if raised on ValueError: bad input" in r.getMessage() for r in caplog.records)


async def test_bad_retry_options_raise_and_register_nothing(gate_broker):
    gate = make_gate(gate_broker)

    with pytest.raises(TypeError, match="retry_if for 'q' must be callable or None, got 3"):
        gate.handle("q", lambda task: None, retry_if=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"backoff for 'q' must be a taskgate.Backoff or None, got '1s'"):
        gate.handle("q", lambda task: None, backoff="1s")  # type: ignore[arg-type]

    gate.handle("q", lambda task: None)  # the type is still free
