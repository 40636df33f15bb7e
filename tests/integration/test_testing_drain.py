"""`taskgate.testing.drain` and `make_task`: an application's tests, on the broker's ManualClock."""

from __future__ import annotations

import time
from datetime import timedelta

import anyio
import pytest
from gate_helpers import make_gate

from taskgate import Backoff, ManualClock, QueueConfig, Status, Task, Throttled
from taskgate.brokers.base import Broker
from taskgate.testing import drain, make_task

pytestmark = pytest.mark.anyio


async def test_drain_finishes_a_task_failing_twice_by_moving_the_clock_not_real_time(
    broker: Broker, clock: ManualClock
) -> None:
    gate = make_gate(broker, max_retry=3)

    @gate.handler("q", backoff=Backoff(base="1m", factor=2, jitter=0))
    async def flaky(task: Task) -> str:
        if task.attempts < 2:
            raise ConnectionError("gateway reset")
        return "ok"

    task_id = await gate.submit("q")
    start, started = clock.now(), time.monotonic()
    (done,) = await drain(gate, timeout=10)
    assert (done.id, done.status, done.attempts, done.result_json()) == (task_id, Status.COMPLETED, 2, "ok")
    assert clock.now() - start == timedelta(minutes=2 + 4)  # both back-offs, on the broker's clock
    assert time.monotonic() - started < 1.0  # in real time, an order of magnitude less


async def test_drain_moves_past_delays_and_throttles_and_returns_tasks_in_finishing_order(
    gate_broker: Broker, clock: ManualClock
) -> None:
    gate = make_gate(gate_broker)
    calls: list[str] = []

    @gate.handler("q")
    async def busy_once(task: Task) -> str:
        calls.append(task.json())
        if task.json() == "busy" and task.throttled == 0:
            raise Throttled(retry_after=600, scope="queue")
        return task.json()

    start = clock.now()
    later = await gate.submit("q", "later", delay="1h")
    busy = await gate.submit("q", "busy")
    finished = await drain(gate)
    assert [t.id for t in finished] == [busy, later]
    assert all(t.status is Status.COMPLETED for t in finished)
    assert clock.now() - start == timedelta(hours=1)
    assert calls == ["busy", "busy", "later"]


async def test_drain_returns_after_the_state_hook_saw_every_change(gate_broker: Broker) -> None:
    seen: list[tuple[str, Status]] = []

    async def slow_hook(task: Task) -> None:
        await anyio.sleep(0.02)  # slower than drain's look at the store: the hook lags behind
        seen.append((task.id, task.status))

    gate = make_gate(gate_broker, on_state_change=slow_hook)
    gate.handle("q", lambda task: None)
    task_id = await gate.submit("q")
    await drain(gate)
    assert seen[-1] == (task_id, Status.COMPLETED)


async def test_drain_waits_for_a_running_gate_and_leaves_it_running(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker)
    gate.handle("q", lambda task: task.json() * 2)
    async with gate:
        first = await gate.submit("q", 1)
        finished = [t.id for t in await drain(gate)]
        assert (await gate.get(first)).status is Status.COMPLETED  # drain waited for it
        # The running gate may finish it before drain first looks: then it ended before the call.
        assert finished in ([first], [])
        second = await gate.submit("q", 2)
        assert await gate.wait_json(second, timeout=10) == 4  # still running after drain


async def test_drain_can_run_a_stopped_gate_again_and_again(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker)
    gate.handle("q", lambda task: task.json())
    for n in range(3):
        task_id = await gate.submit("q", n)
        (done,) = await drain(gate)
        assert (done.id, done.result_json()) == (task_id, n)
    assert await drain(gate) == []


async def test_drain_leaves_a_paused_queue_and_types_without_handlers_waiting(gate_broker: Broker) -> None:
    queues = {"q": QueueConfig(workers=1), "held": QueueConfig(workers=1)}
    gate = make_gate(gate_broker, queues, routes={"h": "held", "nobody": "q"})
    gate.handle("h", lambda task: None)
    await gate.pause("held")
    held = await gate.submit("h")
    orphan = await gate.submit("nobody")
    assert await drain(gate, timeout=5) == []
    assert {(await gate.get(i)).status for i in (held, orphan)} == {Status.PENDING}


async def test_drain_raises_timeout_error_naming_the_work_still_running(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker)
    never = anyio.Event()

    @gate.handler("q")
    async def stuck(task: Task) -> None:
        await never.wait()

    task_id = await gate.submit("q")
    with pytest.raises(TimeoutError, match=rf"drain: work not done after 0.3s \(running: q {task_id}"):
        await drain(gate, timeout=0.3)


async def test_drain_refuses_a_bad_timeout(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker)
    with pytest.raises(ValueError, match="drain timeout must be a positive number of seconds, got 0"):
        await drain(gate, timeout=0)


def test_make_task_builds_what_a_handler_is_called_with() -> None:
    def handler(task: Task) -> dict[str, int]:
        return {"doubled": task.json()["n"] * 2, "attempt": task.attempts}

    task = make_task(type="double", payload={"n": 21}, attempts=1)
    assert handler(task) == {"doubled": 42, "attempt": 1}
    assert (task.type, task.queue, task.status, task.claims) == ("double", "default", Status.RUNNING, 1)
    assert make_task().id != make_task().id
    assert make_task(payload=b"raw", status="retrying").payload == b"raw"
    assert make_task(status="retrying", depends_on=["a"]).depends_on == ("a",)


def test_make_task_refuses_unknown_fields_and_unstorable_payloads() -> None:
    with pytest.raises(TypeError, match=r"make_task: unknown Task field\(s\) attempt, paylod"):
        make_task(paylod=1, attempt=2)
    with pytest.raises(TypeError, match="payload must be bytes, None or JSON-serialisable"):
        make_task(payload=object())
