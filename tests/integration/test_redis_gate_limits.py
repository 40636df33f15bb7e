"""Global limits of the Redis broker through the real runtime (`Gate`), across processes.

`test_redis_multiprocess.py` checks the broker's `DistributedLimiter` calls on their own; here
whole Gates in separate processes (``redis_gate_worker``, started with ``spawn``) share one
Redis key prefix, so the runtime's path -- take slots, take rate, claim, renew slots with the
heartbeat, release -- is what is measured. Probe handlers record into Redis on the server's
clock; each test uses a random prefix and deletes its keys afterwards.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

import anyio
import pytest
import redis
from gate_helpers import until
from helpers.redis_servers import purge_keys
from redis_gate_worker import QUEUE, TYPE, CountingRedisBroker, Probe, WorkerSpec, make_gate, serve, server_us

from taskgate import Config, Gate, QueueConfig, Status
from taskgate.brokers.base import NewTask
from taskgate.brokers.params import Claim, SharedLimits
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.ids import new_id
from taskgate.task import Filter
from taskgate.testing import steps

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")
CHILD_TIMEOUT = 60.0  # a child that has not reported by then hangs
T = TypeVar("T")


@pytest.fixture
def shared(redis_url: str, unique_prefix: str) -> Iterator[tuple[str, str]]:
    """``(url, prefix)`` of the shared Redis for this test; the prefix's keys go afterwards."""
    yield redis_url, unique_prefix
    client = redis.Redis.from_url(redis_url)
    try:
        purge_keys(client, KeySpace(unique_prefix).pattern())
    finally:
        client.close()


@pytest.fixture
def probe(shared: tuple[str, str]) -> Iterator[Probe]:
    """The probe keys of this test, read from the test process."""
    reader = Probe(*shared)
    yield reader
    reader.close()


def _enqueue(url: str, prefix: str, count: int) -> list[str]:
    broker = RedisBroker(url, key_prefix=prefix)
    tasks = [NewTask(id=new_id(), type=TYPE, queue=QUEUE) for _ in range(count)]
    try:
        return [t.id for t in steps.enqueue(broker, tasks)]
    finally:
        broker.close()


Tally = dict[str, int]


def _run_children(specs: list[WorkerSpec]) -> dict[int, Tally]:
    """Run one Gate process per spec, released together by a barrier; pid -> limiter tally."""
    barrier, results = SPAWN.Barrier(len(specs)), SPAWN.Queue()
    children = [SPAWN.Process(target=serve, args=(spec, barrier, results)) for spec in specs]
    for child in children:
        child.start()
    try:
        reported = _collect(results, children)
        for child in children:
            child.join(CHILD_TIMEOUT)
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()
    assert [c.exitcode for c in children] == [0] * len(children)
    assert set(reported) == {c.pid for c in children}
    return reported


def _collect(results: Any, children: list[Any]) -> dict[int, Tally]:
    """What every child put on ``results``; fails at once when a child died without reporting."""
    reported: dict[int, Tally] = {}
    deadline = time.monotonic() + CHILD_TIMEOUT
    while len(reported) < len(children) and time.monotonic() < deadline:
        try:
            pid, tally = results.get(timeout=0.1)
        except queue.Empty:
            crashed = [c.exitcode for c in children if c.exitcode not in (None, 0)]
            assert not crashed, f"a child gate died with exit code(s) {crashed}"
            continue
        reported[pid] = tally
    return reported


def _slots_held(client: redis.Redis, prefix: str) -> list[tuple[bytes, float]]:
    return client.zrange(KeySpace(prefix).slots(QUEUE), 0, -1, withscores=True)


def _wait_for(action: Callable[[], T], within: float) -> T:
    """Call ``action`` until it returns something truthy (a condition wait with a deadline)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if result := action():
            return result
        time.sleep(0.01)
    raise AssertionError(f"condition not met within {within}s")


# -- concurrency: workers=2 is global across two processes ------------------------------------

CONCURRENT_TASKS = 60


def test_two_gates_with_two_workers_each_never_run_more_than_two_at_once(
    shared: tuple[str, str], probe: Probe
) -> None:
    url, prefix = shared
    _enqueue(url, prefix, CONCURRENT_TASKS)
    specs = [
        WorkerSpec(url, prefix, "live", workers=2, total=CONCURRENT_TASKS, backend=backend)
        for backend in ("asyncio", "trio")
    ]
    tallies = _run_children(specs)

    snapshots = [s.decode().split() for s in probe.client.lrange(probe.snapshots, 0, -1)]
    assert len(snapshots) == CONCURRENT_TASKS
    assert max(len(s) for s in snapshots) == 2, "two at once, never more, over both processes"
    # Which process wins each freed slot is a race (fairness is not promised; under load one
    # process may win them all). A process refused slots while its own two workers were free
    # shows the limit is global: per-process limits never refuse.
    running_pids = {int(member.split(":")[0]) for s in snapshots for member in s}
    assert running_pids <= set(tallies)
    assert any(t.get("slots_refused", 0) > 0 for t in tallies.values()), "a process was held back globally"
    assert _slots_held(probe.client, prefix) == [], "every slot was released"


# -- rate: rps=5 is global across two processes ------------------------------------------------

RPS = 5.0
BURST = 5  # burst=0 means max(1, int(rps))
RATE_TASKS = 15
# Starts are claim times; the grant-to-claim latency differs between starts, so a window of
# starts can look up to this much shorter than the window of their grants.
JITTER_S = 0.1


def _worst_excess(starts_us: list[int]) -> float:
    """Max over windows [a, b] of starts: (starts inside) - (burst + rps * (b - a + jitter))."""
    starts_us = sorted(starts_us)
    worst = float("-inf")
    for i, lo in enumerate(starts_us):
        for j in range(i, len(starts_us)):
            window = (starts_us[j] - lo) / 1_000_000 + JITTER_S
            worst = max(worst, (j - i + 1) - (BURST + RPS * window))
    return worst


def test_two_gates_at_five_rps_start_at_most_burst_plus_rate_times_window(
    shared: tuple[str, str], probe: Probe
) -> None:
    url, prefix = shared
    _enqueue(url, prefix, RATE_TASKS)
    specs = [
        WorkerSpec(url, prefix, "starts", workers=10, rps=RPS, total=RATE_TASKS, backend=backend)
        for backend in ("trio", "asyncio")
    ]
    tallies = _run_children(specs)

    starts = [int(r.decode().split()[1]) for r in probe.client.lrange(probe.starts, 0, -1)]
    assert len(starts) == RATE_TASKS
    assert _worst_excess(starts) <= 0
    # Both processes asked the shared limiter and were refused: with a per-process limit,
    # each would have started its own burst at once. (Which process wins each start after
    # the burst is a race: under load one process may win them all.)
    assert all(t.get("rate_refused", 0) > 0 for t in tallies.values())
    assert sum(t.get("rate_granted", 0) for t in tallies.values()) >= RATE_TASKS
    # Not starved either: after the burst, about RPS starts per second.
    span = (max(starts) - min(starts)) / 1_000_000
    assert span <= (RATE_TASKS - BURST) / RPS + 1.0
    assert _slots_held(probe.client, prefix) == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_an_idle_gate_still_starts_a_burst_at_once(shared: tuple[str, str], probe: Probe) -> None:
    url, prefix = shared
    broker = CountingRedisBroker(url, key_prefix=prefix)
    spec = WorkerSpec(url, prefix, "starts", workers=10, rps=RPS)
    try:
        async with make_gate(spec, broker, probe) as gate:
            with anyio.fail_after(CHILD_TIMEOUT):
                while True:
                    polls = broker.tally["claim_calls"] + broker.tally["probe_calls"]
                    if polls >= 3:  # the empty queue has been polled several times
                        break
                    await anyio.sleep(0.01)
                ids = await gate.submit_many(TYPE, [None] * BURST)
                for task_id in ids:
                    await gate.wait(task_id)
    finally:
        broker.close()
    starts = [int(r.decode().split()[1]) for r in probe.client.lrange(probe.starts, 0, -1)]
    assert (max(starts) - min(starts)) / 1_000_000 <= JITTER_S, "the burst should start at once"


@pytest.mark.anyio
async def test_a_task_submitted_in_process_gives_its_global_slot_back(shared: tuple[str, str]) -> None:
    # One global slot and a long lease: were the slot of a task submitted here and claimed by
    # its woken scheduler not given back, the next task would wait for it to expire.
    url, prefix = shared
    broker = RedisBroker(url, key_prefix=prefix)
    config = Config(
        broker=broker, queues={QUEUE: QueueConfig(workers=1, lease_ttl="60s")}, routes={TYPE: QUEUE}
    )
    gate = Gate(config, poll_interval=0.02)
    gate.handle(TYPE, lambda task: None)

    async def idle() -> bool:
        scheduler = gate._runtime.schedulers.get(QUEUE)
        return scheduler is not None and scheduler.idle

    try:
        async with gate:
            for _ in range(3):
                await until(idle)
                task_id = await gate.submit(TYPE)
                with anyio.fail_after(10):
                    await gate.wait(task_id)
                assert (await gate.get(task_id)).claims == 1
    finally:
        broker.close()


@pytest.mark.anyio
async def test_slots_of_a_queue_short_of_slots_go_back_with_its_next_claim(shared: tuple[str, str]) -> None:
    # Another process holds one of the two global slots, so every claim of this gate comes back
    # short (one task for two free workers) and the queue looks idle. Its finished handlers'
    # slots must still ride on the next claim, not cost a release call of their own per task
    # (which also made the acks miss that claim: two calls per cycle, not one).
    url, prefix = shared
    other = RedisBroker(url, key_prefix=prefix)
    broker = CountingRedisBroker(url, key_prefix=prefix)
    (held,) = _enqueue(url, prefix, 1)
    ids = _enqueue(url, prefix, 20)
    config = Config(broker=broker, queues={QUEUE: QueueConfig(workers=2)}, routes={TYPE: QUEUE})
    gate = Gate(config, poll_interval=0.05)
    gate.handle(TYPE, lambda task: None)
    try:
        hold = Claim(QUEUE, 1, timedelta(seconds=60), shared=SharedLimits(workers=2))
        assert [lease.task.id for lease in other.claim(hold).leases] == [held]
        async with gate:
            with anyio.fail_after(CHILD_TIMEOUT):
                for task_id in ids:
                    await gate.wait(task_id)
            assert broker.tally["claim_granted"] == len(ids)
            assert broker.tally["claim_calls"] >= len(ids)  # one task per claim: one slot free
            # The queue running dry may give slots back on its own before it sleeps; nothing else.
            assert broker.tally["release_calls"] <= 1
    finally:
        broker.close()
        other.close()


# -- claims: 4 gates, 2,000 tasks, each run exactly once ---------------------------------------

MANY_TASKS = 2000


def test_four_gates_run_two_thousand_tasks_exactly_once(shared: tuple[str, str], probe: Probe) -> None:
    url, prefix = shared
    ids = _enqueue(url, prefix, MANY_TASKS)
    specs = [
        WorkerSpec(url, prefix, "runs", workers=16, total=MANY_TASKS, backend=("asyncio", "trio")[i % 2])
        for i in range(4)
    ]
    pids = set(_run_children(specs))

    runs = [r.decode().split() for r in probe.client.lrange(probe.runs, 0, -1)]
    assert sorted(task_id for _, task_id in runs) == sorted(ids), "each task ran once, none twice"
    assert len({int(pid) for pid, _ in runs} & pids) >= 2, "the processes shared the work"
    broker = RedisBroker(url, key_prefix=prefix)
    try:
        assert broker.counts() == {TYPE: {Status.COMPLETED: MANY_TASKS}}
        assert {t.claims for t in broker.list(Filter(type=TYPE))} == {1}
    finally:
        broker.close()
    assert _slots_held(probe.client, prefix) == []


# -- crash: a SIGKILLed gate leaks its slot for at most one TTL after its last heartbeat -------

TTL_S = 1.0
TTL_US = 1_000_000


def _start_hanging_child(url: str, prefix: str) -> Any:
    spec = WorkerSpec(url, prefix, "hang", workers=1, lease_ttl=TTL_S)
    child = SPAWN.Process(target=serve, args=(spec, None, None))
    child.start()
    return child


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.anyio
async def test_a_killed_gate_frees_its_slot_and_its_task_reruns_within_two_ttls(
    shared: tuple[str, str], probe: Probe
) -> None:
    url, prefix = shared
    (task_id,) = _enqueue(url, prefix, 1)
    child = _start_hanging_child(url, prefix)
    try:
        started = _wait_for(lambda: probe.client.get(probe.started), CHILD_TIMEOUT).decode().split()
        assert started == [str(child.pid), task_id, "1"]
        ((_, first_expiry),) = _slots_held(probe.client, prefix)
        # The heartbeat renews the slot with the lease (capacity 1: the child holds it alone).
        _wait_for(lambda: _slots_held(probe.client, prefix)[0][1] > first_expiry, 2 * TTL_S)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(CHILD_TIMEOUT)
    killed_at = server_us(probe.client)
    assert child.exitcode == -signal.SIGKILL
    ((_, dead_expiry),) = _slots_held(probe.client, prefix)
    assert dead_expiry <= killed_at + TTL_US, "renewed at most one TTL ahead"

    rerun_at = await _rerun_here(url, prefix, probe, task_id)

    assert dead_expiry <= rerun_at <= killed_at + 2 * TTL_US
    broker = RedisBroker(url, key_prefix=prefix)
    try:
        task = broker.get(task_id)
    finally:
        broker.close()
    assert (task.status, task.claims, task.lease_lost) == (Status.COMPLETED, 2, 1)
    assert _slots_held(probe.client, prefix) == [], "the dead slot was purged, the new one released"


async def _rerun_here(url: str, prefix: str, probe: Probe, task_id: str) -> int:
    """Run a Gate in this process until ``task_id`` completes; the server µs it was claimed again."""
    spec = WorkerSpec(url, prefix, "starts", workers=1, lease_ttl=TTL_S, reap_interval=0.05)
    broker = RedisBroker(url, key_prefix=prefix)
    helper = Probe(url, prefix)
    try:
        async with make_gate(spec, broker, helper) as gate:
            with anyio.fail_after(CHILD_TIMEOUT):
                while True:
                    if (await gate.get(task_id)).status is Status.COMPLETED:
                        break
                    await anyio.sleep(0.01)
    finally:
        helper.close()
        broker.close()
    ((pid, started_us),) = (r.decode().split() for r in probe.client.lrange(probe.starts, 0, -1))
    assert int(pid) == os.getpid()
    return int(started_us)


# -- quota: two gates sharing one window ------------------------------------------------------

QUOTA = 5


async def _quota_exhausted(gate: Gate) -> bool:
    return (await gate.stats(QUEUE)).quota_exhausted


async def _none_running(gate: Gate) -> bool:
    return (await gate.overview())[TYPE].get(Status.RUNNING, 0) == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_two_gates_sharing_a_quota_start_exactly_its_limit(shared: tuple[str, str]) -> None:
    url, prefix = shared
    brokers = [RedisBroker(url, key_prefix=prefix) for _ in range(2)]
    ran: list[str] = []
    gates = []
    for broker in brokers:
        queue = QueueConfig(workers=3, quota_limit=QUOTA, quota_period="1h")
        gate = Gate(Config(broker=broker, queues={QUEUE: queue}, routes={TYPE: QUEUE}), poll_interval=0.01)
        gate.handle(TYPE, lambda task: ran.append(task.id))
        gates.append(gate)
    try:
        async with gates[0], gates[1]:
            ids = await gates[0].submit_many(TYPE, [None] * (QUOTA + 7))
            for gate in gates:
                await until(partial(_quota_exhausted, gate), within=CHILD_TIMEOUT)
            # The last starts may still be writing their acks (group commit) when the quota
            # reads exhausted; once none runs, nothing else can start.
            await until(partial(_none_running, gates[0]), within=CHILD_TIMEOUT)
            overview = (await gates[0].overview())[TYPE]
            assert overview.get(Status.COMPLETED, 0) == QUOTA
            assert overview.get(Status.PENDING, 0) == len(ids) - QUOTA
    finally:
        for broker in brokers:
            broker.close()
    assert len(ran) == len(set(ran)) == QUOTA
