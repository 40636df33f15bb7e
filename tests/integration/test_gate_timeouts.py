"""A run past its timeout is cancelled and counts as a business failure, on every backend.

Timeouts run on the runtime's own (real) time, so they are kept small and the tests assert
outcomes, never durations; the broker's `ManualClock` only moves retries due. A hung gateway
call is a handler waiting for an event that never fires.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import anyio
import anyio.lowlevel
import pytest
from gate_helpers import GUARD, eventually, make_gate

from taskgate import ManualClock, QueueConfig, Status, Task
from taskgate.brokers.base import Broker

pytestmark = pytest.mark.anyio

SHORT = 0.05  # the limit a hung handler runs into
TIMED_OUT = "TimeoutError: ran longer than 0.05s (timeout)"


def timed_queue(timeout: object = SHORT, workers: int = 1) -> QueueConfig:
    """A queue whose runs may take ``timeout``; its lease outlives any test (no reaping)."""
    return QueueConfig(workers=workers, lease_ttl="1h", timeout=timeout)  # type: ignore[arg-type]


async def hang(task: Task) -> None:
    """A gateway call that never answers."""
    await anyio.Event().wait()


async def test_an_async_handler_past_its_queue_timeout_is_retried_then_failed(
    broker: Broker, clock: ManualClock
) -> None:
    gate = make_gate(broker, {"q": timed_queue()}, max_retry=1)
    gate.handle("q", hang)
    async with gate:
        task_id = await gate.submit("q")
        retrying = await eventually(gate, task_id, lambda t: t.status is Status.RETRYING)
        assert (retrying.attempts, retrying.last_error) == (1, TIMED_OUT)
        clock.advance(3)  # past the first back-off (2 s, +/- 20 %)
        failed = await eventually(gate, task_id, lambda t: t.status.is_final)
    assert (failed.status, failed.attempts, failed.claims) == (Status.FAILED, 2, 2)
    assert (failed.last_error, failed.throttled, failed.lease_lost, failed.result) == (TIMED_OUT, 0, 0, None)


async def test_a_tasks_own_timeout_wins_over_its_queues_either_way(broker: Broker) -> None:
    gate = make_gate(broker, {"q": timed_queue("1h", workers=2)}, routes={"probe": "q"})
    release, long_started = anyio.Event(), anyio.Event()

    @gate.handler("q")
    async def held(task: Task) -> str:
        if task.json() == "long":
            long_started.set()
            await release.wait()
        else:
            await anyio.Event().wait()
        return "done"

    gate.handle("probe", hang)
    async with gate:
        # Shorter than the queue's hour: the task's own 0.05 s cancels it.
        short = await gate.submit("q", "short", timeout=SHORT)
        failed = await eventually(gate, short, lambda t: t.status.is_final)
        assert (failed.status, failed.attempts, failed.last_error) == (Status.FAILED, 1, TIMED_OUT)
        # Longer than the queue's: the long task outlives a probe started after it under the
        # 0.05 s probe limit, and still runs.
        long = await gate.submit("q", "long", timeout=timedelta(hours=2))
        with anyio.fail_after(GUARD):
            await long_started.wait()
        probe = await gate.submit("probe", timeout="50ms")
        assert (await eventually(gate, probe, lambda t: t.status.is_final)).last_error == TIMED_OUT
        assert (await gate.get(long)).status is Status.RUNNING
        release.set()
        completed = await eventually(gate, long, lambda t: t.status.is_final)
    assert (completed.status, completed.attempts, completed.result_json()) == (Status.COMPLETED, 0, "done")
    assert (completed.timeout, failed.timeout) == (timedelta(hours=2), timedelta(seconds=SHORT))


async def test_a_timed_out_sync_handler_keeps_its_slot_until_its_thread_returns(broker: Broker) -> None:
    gate = make_gate(broker, {"q": timed_queue(workers=1)})
    release, first_started = threading.Event(), threading.Event()
    overlapped: list[bool] = []

    @gate.handler("q")
    def blocking(task: Task) -> str:
        if task.json() == "first":
            first_started.set()
            release.wait(GUARD)
            return "too late"
        overlapped.append(not release.is_set())
        return "second"

    try:
        async with gate:
            first = await gate.submit("q", "first")
            second = await gate.submit("q", "second")
            failed = await eventually(gate, first, lambda t: t.status.is_final)
            assert first_started.is_set() and not release.is_set()
            assert (failed.status, failed.attempts, failed.last_error) == (Status.FAILED, 1, TIMED_OUT)
            # The run is over, its thread is not: the one worker slot is still taken, so the
            # second task is not even claimed.
            assert (await gate.stats("q")).running == 1
            waiting = await gate.get(second)
            assert (waiting.status, waiting.claims) == (Status.PENDING, 0)
            release.set()
            done = await eventually(gate, second, lambda t: t.status.is_final)
    finally:
        release.set()
    assert (done.status, done.result_json(), overlapped) == (Status.COMPLETED, "second", [False])
    assert await gate.get(first) == failed  # the late result was discarded


async def test_handlers_finishing_within_their_timeout_complete(broker: Broker) -> None:
    gate = make_gate(broker, {"q": timed_queue(GUARD, workers=2)}, routes={"sync": "q"})
    gate.handle("q", _answer)
    gate.handle("sync", lambda task: task.json())
    async with gate:
        ids = [await gate.submit("q", "async"), await gate.submit("sync", "sync", timeout=GUARD)]
        done = [await eventually(gate, task_id, lambda t: t.status.is_final) for task_id in ids]
    assert [(t.status, t.result_json(), t.attempts) for t in done] == [
        (Status.COMPLETED, "async", 0),
        (Status.COMPLETED, "sync", 0),
    ]


async def _answer(task: Task) -> object:
    await anyio.lowlevel.checkpoint()
    return task.json()


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (0, ValueError, r"timeout must be > 0"),
        (-1.5, ValueError, r"timeout must be > 0"),
        ("-3s", ValueError, r"timeout must be > 0"),
        (timedelta(days=40_000), ValueError, r"timeout must be > 0 and at most 36500 days"),
        (float("nan"), ValueError, r"timeout: duration must be finite"),
        (float("inf"), ValueError, r"timeout: duration must be finite"),
        ("soon", ValueError, r"timeout: cannot read 'soon'"),
        (True, TypeError, r"timeout must be a timedelta, seconds or a string"),
        ([30], TypeError, r"timeout must be a timedelta, seconds or a string"),
    ],
)
async def test_a_bad_timeout_is_refused_naming_it_and_stores_nothing(
    gate_broker: Broker, bad: object, error: type[Exception], match: str
) -> None:
    gate = make_gate(gate_broker)
    with pytest.raises(error, match=match):
        await gate.submit("q", timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        await gate.submit_many("q", [1, 2], timeout=bad)  # type: ignore[arg-type]
    assert await gate.list() == []


async def test_a_handlers_timeout_limits_its_type_between_the_tasks_and_the_queues(broker: Broker) -> None:
    gate = make_gate(broker, {"q": timed_queue("1h", workers=3)}, routes={"quick": "q", "slow": "q"})
    gate.handle("quick", hang, timeout=SHORT)  # its own limit, shorter than the queue's hour
    gate.handle("slow", hang)
    async with gate:
        quick = await gate.submit("quick")
        failed = await eventually(gate, quick, lambda t: t.status.is_final)
        assert (failed.status, failed.last_error) == (Status.FAILED, TIMED_OUT)
        slow = await gate.submit("slow")
        own = await gate.submit("quick", timeout="1h")  # a task's own timeout still wins
        running = [await eventually(gate, t, lambda t: t.status is Status.RUNNING) for t in (slow, own)]
        # A quick task started after them runs into the handler's limit; they outlive it.
        later = await gate.submit("quick")
        assert (await eventually(gate, later, lambda t: t.status.is_final)).status is Status.FAILED
        assert [(await gate.get(t.id)).status for t in running] == [Status.RUNNING, Status.RUNNING]
        await gate.cancel(slow)
        await gate.cancel(own)


@pytest.mark.parametrize("bad", [0, -1, "soon", timedelta(days=40_000)])
def test_a_bad_handler_timeout_is_refused_naming_it_and_registers_nothing(bad: object) -> None:
    from taskgate.brokers.memory import MemoryBroker

    gate = make_gate(MemoryBroker())
    with pytest.raises((TypeError, ValueError), match="timeout"):
        gate.handle("q", hang, timeout=bad)  # type: ignore[arg-type]
    gate.handle("q", hang)  # nothing was registered: the type is free
