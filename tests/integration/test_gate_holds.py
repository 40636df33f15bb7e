"""Holding a queue: a queue-wide `Throttled`, `Gate.pause` and `Gate.resume`, and
``QueueStats.paused_until`` -- on memory and SQLite, time moved by the test's `ManualClock`.

Holds are on the store's clock, so a held queue stays held however long the test waits in real
time; the short real waits below only give a wrongly started handler the chance to show.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest
from gate_helpers import GUARD, POLL, eventually, make_gate

from taskgate import ConfigError, Gate, ManualClock, QueueConfig, Status, Task, Throttled
from taskgate.brokers.base import Broker

pytestmark = pytest.mark.anyio

UNTIL_RESUMED = datetime.max.replace(tzinfo=UTC)
QUEUES = {"q": QueueConfig(workers=1), "other": QueueConfig(workers=1)}


async def _a_few_polls() -> None:
    """Long enough for a scheduler that was going to claim to have claimed, several times."""
    await anyio.sleep(POLL * 10)


def _recording_gate(broker: Broker, started: list[str]) -> Gate:
    gate = make_gate(broker, QUEUES)

    @gate.handler("q")
    async def record(task: Task) -> str:
        started.append(task.id)
        return task.id

    @gate.handler("other")
    async def other(task: Task) -> str:
        return task.id

    return gate


async def test_a_queue_wide_throttle_holds_every_other_task_of_the_queue_until_retry_after(
    gate_broker: Broker, clock: ManualClock
) -> None:
    gate = make_gate(gate_broker, QUEUES)
    started: list[str] = []

    @gate.handler("q")
    async def busy_once(task: Task) -> None:
        started.append(task.id)
        if len(started) == 1:
            raise Throttled(retry_after=30, scope="queue")

    @gate.handler("other")
    async def other(task: Task) -> str:
        return "ok"

    async with gate:
        throttled_at = clock.now()
        throttled = await gate.submit("q")
        await eventually(gate, throttled, lambda t: t.status is Status.RETRYING)
        waiting = await gate.submit("q")
        assert await gate.wait(await gate.submit("other"), timeout=GUARD) == b'"ok"'  # not held
        await _a_few_polls()
        assert started == [throttled]
        assert (await gate.get(waiting)).status is Status.PENDING
        assert (await gate.stats("q")).paused_until == throttled_at + timedelta(seconds=30)
        clock.advance(29)
        await _a_few_polls()
        assert started == [throttled]
        clock.advance(1)
        await gate.wait(waiting, timeout=GUARD)
        await gate.wait(throttled, timeout=GUARD)
        assert (await gate.stats("q")).paused_until is None
    assert sorted(started[1:]) == sorted([throttled, waiting])


async def test_a_task_scoped_throttle_holds_only_its_task(gate_broker: Broker, clock: ManualClock) -> None:
    gate = make_gate(gate_broker, QUEUES)
    throttles: list[str] = []

    @gate.handler("q")
    async def busy_once(task: Task) -> str:
        if not throttles:
            throttles.append(task.id)
            raise Throttled(retry_after=30)
        return task.id

    async with gate:
        throttled = await gate.submit("q")
        await eventually(gate, throttled, lambda t: t.status is Status.RETRYING)
        assert await gate.wait(await gate.submit("q"), timeout=GUARD) is not None
        assert (await gate.stats("q")).paused_until is None


async def test_pause_until_resumed_holds_the_queue_while_running_handlers_finish(
    gate_broker: Broker, clock: ManualClock
) -> None:
    gate = make_gate(gate_broker, QUEUES)
    started: list[str] = []
    first_started, release = anyio.Event(), anyio.Event()

    @gate.handler("q")
    async def slow(task: Task) -> str:
        started.append(task.id)
        first_started.set()
        await release.wait()
        return task.id

    async with gate:
        running = await gate.submit("q")
        with anyio.fail_after(GUARD):
            # Its handler runs (a lease claimed and not yet started when the pause comes goes
            # back: nothing starts from a held queue).
            await first_started.wait()
        assert await gate.pause("q") == UNTIL_RESUMED
        waiting = await gate.submit("q")
        release.set()
        assert await gate.wait(running, timeout=GUARD) is not None  # it finished
        clock.advance(timedelta(days=365))
        await _a_few_polls()
        assert (await gate.get(waiting)).status is Status.PENDING
        assert (await gate.stats("q")).paused_until == UNTIL_RESUMED
        await gate.resume("q")
        assert (await gate.stats("q")).paused_until is None
        await gate.wait(waiting, timeout=GUARD)
    assert started == [running, waiting]


async def test_pause_for_a_while_ends_on_the_store_s_clock(gate_broker: Broker, clock: ManualClock) -> None:
    started: list[str] = []
    gate = _recording_gate(gate_broker, started)
    async with gate:
        until = await gate.pause("q", for_="10m")
        assert until == clock.now() + timedelta(minutes=10)
        waiting = await gate.submit("q")
        assert (await gate.stats("q")).paused_until == until
        clock.advance(timedelta(minutes=9))
        await _a_few_polls()
        assert started == []
        clock.advance(timedelta(minutes=1))
        await gate.wait(waiting, timeout=GUARD)
        assert (await gate.stats("q")).paused_until is None


async def test_a_pause_never_shortens_a_longer_one_and_resume_ends_any(gate_broker: Broker) -> None:
    gate = _recording_gate(gate_broker, [])
    hour = await gate.pause("q", for_=timedelta(hours=1))
    assert await gate.pause("q", for_=60) == hour
    await gate.resume("q")
    assert (await gate.stats("q")).paused_until is None
    await gate.resume("q")  # not held: nothing to do


async def test_a_gate_that_runs_no_workers_pauses_and_resumes_the_queue_of_one_that_does(
    gate_broker: Broker, clock: ManualClock
) -> None:
    started: list[str] = []
    worker = _recording_gate(gate_broker, started)
    operator = make_gate(gate_broker, QUEUES)  # a web process or a CLI: never started
    async with worker:
        await operator.pause("q")
        waiting = await worker.submit("q")
        await _a_few_polls()
        assert started == [] and (await worker.stats("q")).paused_until == UNTIL_RESUMED
        await operator.resume("q")
        await worker.wait(waiting, timeout=GUARD)


@pytest.mark.parametrize("scope", ["queues", "", "Queue", None, 1])
def test_a_throttle_of_an_unknown_scope_raises_naming_it(scope: object) -> None:
    with pytest.raises(ValueError, match=repr(scope).replace("(", r"\(")):
        Throttled(retry_after=1, scope=scope)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("for_", "error"),
    [(0, ValueError), (-1, ValueError), ("0s", ValueError), ("soon", ValueError), ([5], TypeError)],
)
async def test_a_bad_pause_raises_naming_for_and_changes_nothing(
    gate_broker: Broker, for_: object, error: type[Exception]
) -> None:
    gate = _recording_gate(gate_broker, [])
    with pytest.raises(error, match="for_"):
        await gate.pause("q", for_=for_)  # type: ignore[arg-type]
    assert (await gate.stats("q")).paused_until is None


async def test_pausing_or_resuming_an_unconfigured_queue_raises_naming_it(gate_broker: Broker) -> None:
    gate = _recording_gate(gate_broker, [])
    with pytest.raises(ConfigError, match="'nowhere'"):
        await gate.pause("nowhere")
    with pytest.raises(ConfigError, match="'nowhere'"):
        await gate.resume("nowhere")
    assert (await gate.stats("q")).paused_until is None
