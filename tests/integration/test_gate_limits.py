"""Limits measured, not assumed: workers, rate, quotas, and queues that never wait on each other."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from gate_helpers import GUARD, Faulty, eventually, make_gate, until

from taskgate import BrokerError, Filter, Gate, QueueConfig, Status, Task

pytestmark = pytest.mark.anyio

EPSILON = 0.05  # seconds of scheduling jitter allowed when checking the rate bound


async def _flag(gate: Gate, queue: str, name: str) -> bool:
    return bool(getattr(await gate.stats(queue), name))


async def test_workers_and_rate_hold_in_every_window(gate_broker):
    """Counted in this process (``shared_limits=False``): the rate runs on the process's clock.
    Counted in the store, it runs on the store's (`test_a_shared_rate_runs_on_the_store_clock`)."""
    rps, burst, workers, n = 5.0, 5, 2, 12
    gate = make_gate(gate_broker, {"q": QueueConfig(workers=workers, rps=rps, shared_limits=False)})
    starts: list[float] = []
    running = 0
    peak = 0

    @gate.handler("q")
    async def work(task: Task) -> None:
        nonlocal running, peak
        starts.append(anyio.current_time())
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.02)
        running -= 1

    async with gate:
        ids = await gate.submit_many("q", range(n))
        for task_id in ids:
            await gate.wait(task_id, timeout=GUARD)
    assert len(starts) == n and peak <= workers
    starts.sort()
    for i in range(n):
        for j in range(i, n):
            window = starts[j] - starts[i]
            assert j - i + 1 <= burst + rps * (window + EPSILON), (i, j, window)
    # the bucket starts full, then refills at rps: the run cannot be faster than that
    assert starts[-1] - starts[0] >= (n - burst) / rps - EPSILON


SHARED_BACKENDS = ["memory", "sqlite", "postgresql", "mysql", "redis"]


@pytest.mark.parametrize("backend", SHARED_BACKENDS, indirect=True)
async def test_a_shared_rate_runs_on_the_store_clock(broker, clock):
    """Shared limits are counted on the store's clock: with it frozen, the burst runs and the
    rest waits, however long in real time; each second it moves lets one more start."""
    gate = make_gate(broker, {"q": QueueConfig(workers=10, rps=1, burst=2)})
    started: list[str] = []
    gate.handle("q", lambda task: started.append(task.id))
    async with gate:
        ids = await gate.submit_many("q", range(5))
        await until(lambda: _count(started, 2))
        await gate.wait(ids[1], timeout=GUARD)
        assert (await gate.get(ids[2])).status is Status.PENDING
        for n in (3, 4, 5):
            clock.advance(timedelta(seconds=1))
            await until(lambda n=n: _count(started, n))
        await gate.wait(ids[4], timeout=GUARD)
    assert sorted(started) == sorted(ids)


@pytest.mark.parametrize("backend", SHARED_BACKENDS, indirect=True)
async def test_two_gates_on_one_store_share_the_queue_workers(broker):
    """Two gates (as two processes would) with workers=1 each: one handler at a time in all."""
    first, second = (make_gate(broker, {"q": QueueConfig(workers=1)}) for _ in range(2))
    release = anyio.Event()
    running: list[str] = []

    async def hold(task: Task) -> None:
        running.append(task.id)
        await release.wait()
        running.remove(task.id)

    for gate in (first, second):
        gate.handle("q", hold)
    async with first, second:
        ids = await first.submit_many("q", range(3))
        await until(lambda: _count(running, 1))
        for _ in range(20):  # both gates look for work, again and again: neither may start one
            await anyio.sleep(0.01)
            assert len(running) == 1
        release.set()
        for task_id in ids:
            await first.wait(task_id, timeout=GUARD)


async def _count(items: list[str], n: int) -> bool:
    return len(items) >= n


async def test_a_blocked_queue_does_not_delay_another(gate_broker):
    queues = {"slow": QueueConfig(workers=1), "fast": QueueConfig(workers=1, rps=50)}
    gate = make_gate(gate_broker, queues)
    release = anyio.Event()

    @gate.handler("slow")
    async def slow(task: Task) -> None:
        await release.wait()

    gate.handle("fast", lambda task: "done")
    async with gate:
        stuck = [await gate.submit("slow") for _ in range(3)]
        quick = [await gate.submit("fast") for _ in range(5)]
        with anyio.fail_after(GUARD):
            for task_id in quick:
                assert await gate.wait(task_id) == b'"done"'
        assert (await gate.get(stuck[0])).status is Status.RUNNING
        assert (await gate.stats("slow")).queue_len == 2
        release.set()
        for task_id in stuck:
            await gate.wait(task_id, timeout=GUARD)


async def test_an_exhausted_quota_pauses_only_its_queue_until_the_next_window(gate_broker, clock):
    queues = {
        "metered": QueueConfig(workers=2, quota_limit=1, quota_period="1h"),
        "free": QueueConfig(workers=1),
    }
    gate = make_gate(gate_broker, queues)
    gate.handle("metered", lambda task: None)
    gate.handle("free", lambda task: None)
    async with gate:
        first, second = await gate.submit_many("metered", [1, 2])
        await eventually(gate, first, lambda t: t.status is Status.COMPLETED)
        await gate.wait(await gate.submit("free"), timeout=GUARD)
        await until(lambda: _flag(gate, "metered", "quota_exhausted"))
        assert (await gate.get(second)).status is Status.PENDING
        clock.advance(timedelta(hours=1))
        await gate.wait(second, timeout=GUARD)  # the new window's one unit


async def test_an_unreachable_quota_fails_closed_and_recovers(gate_broker):
    broker = Faulty(gate_broker)
    broker.failing["claim.quota"] = BrokerError("quota store down")
    gate = make_gate(broker, {"q": QueueConfig(workers=1, quota_limit=10, quota_period="1h")})
    gate.handle("q", lambda task: None)
    async with gate:
        task_id = await gate.submit("q")
        await until(lambda: _flag(gate, "q", "quota_stalled"))
        assert (await gate.get(task_id)).status is Status.PENDING
        assert broker.calls["claim"] == broker.calls["claim.quota"]  # never claims around the quota
        del broker.failing["claim.quota"]
        await gate.wait(task_id, timeout=GUARD)
        assert not (await gate.stats("q")).quota_stalled


async def test_a_same_process_submit_starts_without_polling_delay(gate_broker):
    gate = make_gate(gate_broker, poll_interval=30.0)
    gate.handle("q", lambda task: "fast")
    async with gate:
        with anyio.fail_after(5):  # far below the 30 s poll interval
            for _ in range(3):
                assert await gate.wait(await gate.submit("q")) == b'"fast"'


async def test_stats_show_running_here_and_the_backlog(gate_broker):
    gate = make_gate(gate_broker, {"q": QueueConfig(workers=1, rps=2.5)})
    started, release = anyio.Event(), anyio.Event()

    @gate.handler("q")
    async def hold(task: Task) -> None:
        started.set()
        await release.wait()

    async with gate:
        await gate.submit_many("q", [1, 2, 3])
        with anyio.fail_after(GUARD):
            await started.wait()  # the broker shows RUNNING a moment before the handler starts
        stats = await gate.stats("q")
        assert (stats.workers, stats.running, stats.queue_len, stats.rps) == (1, 1, 2, 2.5)
        release.set()


async def test_a_group_at_its_limit_holds_up_only_its_own_tasks(broker):
    """group_workers=1: tenant a's second task waits for its first, tenant b's runs meanwhile."""
    if not broker.capabilities.group_limits:
        pytest.skip(f"{type(broker).__name__} does not count groups (capabilities.group_limits)")
    gate = make_gate(broker, {"q": QueueConfig(workers=3, group_workers=1)})
    release = anyio.Event()
    started: list[str] = []
    held: list[str] = []  # a's first task to start, held until released

    async def call(task: Task) -> None:
        # Decided from the task alone: on a fast broker a handler may start before
        # `submit_many` has returned the ids.
        started.append(task.id)
        if task.group == "a" and not held:
            held.append(task.id)
            await release.wait()

    gate.handle("q", call)
    async with gate:
        try:
            first_a, second_a = await gate.submit_many("q", [1, 2], group="a")
            only_b = await gate.submit("q", 3, group="b")
            await gate.wait(only_b, timeout=GUARD)  # b ran although a is at its limit
            await until(lambda: _started(started, first_a))  # claimed with b, maybe started after
            assert held == [first_a]
            assert second_a not in started
            assert (await gate.get(second_a)).status is Status.PENDING
        finally:
            release.set()  # a failure must not leave the gate's exit waiting on a held handler
        await gate.wait(second_a, timeout=GUARD)
    assert [t.group for t in await gate.list(Filter(group="a"))] == ["a", "a"]


async def _started(started: list[str], task_id: str) -> bool:
    return task_id in started
