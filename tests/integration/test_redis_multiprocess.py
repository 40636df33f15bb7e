"""RedisBroker across real processes (multiprocessing spawn) sharing one Redis.

Each test uses a random key prefix on the shared Redis and deletes its keys afterwards.
Times are read from Redis ``TIME`` (the brokers run on the server clock, no injected clock),
so every process measures on the same clock as the scripts.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from helpers.redis_servers import purge_keys

from taskgate.brokers.base import Lease, NewTask
from taskgate.brokers.params import Claim, Claimed, GiveBack, Requeue, Settle, SharedLimits
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.task import Filter, Status
from taskgate.testing import steps

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")
# Upper bound for a child to report; reaching it means a hang, not slowness.
CHILD_TIMEOUT = 60.0


def _server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


@pytest.fixture
def shared(redis_url: str, unique_prefix: str) -> Iterator[tuple[str, str]]:
    """``(url, prefix)`` of the shared Redis for this test; the prefix's keys go afterwards."""
    yield redis_url, unique_prefix
    client = redis.Redis.from_url(redis_url)
    try:
        purge_keys(client, KeySpace(unique_prefix).pattern())
    finally:
        client.close()


def _enqueue_tasks(url: str, prefix: str, n: int) -> None:
    broker = RedisBroker(url, key_prefix=prefix)
    try:
        steps.enqueue(broker, [NewTask(id=f"task-{i}", type="t", queue="q") for i in range(n)])
    finally:
        broker.close()


def _run_children(target: Any, args_per_child: list[tuple[Any, ...]]) -> list[Any]:
    """Start one spawn process per args tuple, released together; return what each reported."""
    barrier = SPAWN.Barrier(len(args_per_child))
    results = SPAWN.Queue()
    children = [SPAWN.Process(target=target, args=(*a, barrier, results)) for a in args_per_child]
    for child in children:
        child.start()
    try:
        reports = [results.get(timeout=CHILD_TIMEOUT) for _ in children]
    finally:
        for child in children:
            child.join(CHILD_TIMEOUT)
    assert [c.exitcode for c in children] == [0] * len(children)
    return reports


# -- claims: 4 processes, 2,000 tasks, each claimed exactly once ------------------------------


def _claimer(url: str, prefix: str, barrier: Any, results: Any) -> None:
    broker = RedisBroker(url, key_prefix=prefix)
    mine: list[str] = []
    barrier.wait()
    while leases := steps.claim(broker, "q", 10, timedelta(minutes=5)):
        for lease in leases:
            steps.ack(broker, lease.task.id, lease.token, None)
            mine.append(lease.task.id)
    broker.close()
    results.put(mine)


def test_four_processes_claim_two_thousand_tasks_exactly_once(shared: tuple[str, str]) -> None:
    url, prefix = shared
    broker = RedisBroker(url, key_prefix=prefix)
    ids = [f"task-{i:04d}" for i in range(2000)]
    steps.enqueue(broker, [NewTask(id=i, type="t", queue="q") for i in ids])

    reports = _run_children(_claimer, [(url, prefix)] * 4)

    claimed = [task_id for report in reports for task_id in report]
    assert len(claimed) == len(ids)
    assert sorted(claimed) == ids
    assert broker.counts() == {"t": {Status.COMPLETED: 2000}}
    assert {t.claims for t in broker.list(Filter(type="t"))} == {1}
    broker.close()


# -- slots: capacity 2 is global across two processes ------------------------------------------

SLOT_ROUNDS = 300
SLOT_TASKS = 4  # more than the capacity: a refused claim is for want of a slot, never of a task


def _claim_shared(broker: RedisBroker, limit: int, ttl: timedelta, **limits: Any) -> Claimed:
    """A claim of queue ``q`` under its shared limits (``limits``: `SharedLimits` fields)."""
    return broker.claim(Claim("q", limit, ttl, shared=SharedLimits(**limits)))


def _put_back(broker: RedisBroker, leases: list[Lease]) -> None:
    """Requeue ``leases`` and give their slots back, in one settle: the tasks are due again."""
    items = tuple(Requeue(lease.task.id, lease.token) for lease in leases)
    slots = tuple(lease.token for lease in leases)
    broker.settle(Settle(items, snapshots=False, give_back=GiveBack(queue="q", slots=slots)))


def _slot_holder(url: str, prefix: str, want: int, barrier: Any, results: Any) -> None:
    broker = RedisBroker(url, key_prefix=prefix)
    clock = redis.Redis.from_url(url)
    held: list[tuple[int, int, int]] = []
    denied = 0
    barrier.wait()
    for _ in range(SLOT_ROUNDS):
        leases = _claim_shared(broker, want, timedelta(seconds=30), workers=2).leases
        if not leases:
            denied += 1
            continue
        # [start, end] lies inside the true holding interval: read after the claim, before the
        # slots go back.
        start = _server_us(clock)
        end = _server_us(clock)
        _put_back(broker, leases)
        held.append((start, end, len(leases)))
    broker.close()
    clock.close()
    results.put((held, denied))


def _max_overlap(intervals: list[tuple[int, int, int]]) -> int:
    """Most slots held at one instant; at equal times a release counts before an acquire."""
    events = [(s, 1, n) for s, _, n in intervals] + [(e, 0, -n) for _, e, n in intervals]
    level = peak = 0
    for _, _, delta in sorted(events):
        level += delta
        peak = max(peak, level)
    return peak


def test_two_processes_never_hold_more_than_the_global_capacity(shared: tuple[str, str]) -> None:
    url, prefix = shared
    _enqueue_tasks(url, prefix, SLOT_TASKS)
    reports = _run_children(_slot_holder, [(url, prefix, 1), (url, prefix, 2)])

    intervals = [interval for held, _ in reports for interval in held]
    assert all(held for held, _ in reports), "each process must have held slots at some point"
    assert sum(denied for _, denied in reports) > 0, "the processes never contended"
    assert _max_overlap(intervals) == 2


# -- rate: GCRA rps=5 shared by two processes --------------------------------------------------

RPS = 5.0
BURST = 3
RATE_SECONDS = 1.5
RATE_TASKS = 4  # each start is put back at once: a claim never finds the queue empty


def _rate_taker(url: str, prefix: str, barrier: Any, results: Any) -> None:
    broker = RedisBroker(url, key_prefix=prefix)
    clock = redis.Redis.from_url(url)
    grants: list[tuple[int, int]] = []
    barrier.wait()
    stop = _server_us(clock) + int(RATE_SECONDS * 1_000_000)
    while (before := _server_us(clock)) < stop:
        # Slots to spare: only the rate holds a start back.
        taken = _claim_shared(broker, 1, timedelta(seconds=30), workers=100, rps=RPS, burst=BURST)
        after = _server_us(clock)
        if taken.leases:
            grants.append((before, after))
            _put_back(broker, taken.leases)
        else:
            # What a rate-limited caller does: wait as told (capped, to keep contending).
            time.sleep(min(taken.retry_after, 0.05))
    broker.close()
    clock.close()
    results.put(grants)


def _worst_excess(grants: list[tuple[int, int]]) -> float:
    """Max over windows of (starts in the window) - (burst + rps * window length).

    Each grant's true time lies in its [before, after]; the grants whose whole interval lies
    in [before_i, after_j] truly started within that window, so this never overstates.
    """
    worst = float("-inf")
    for lo, _ in grants:
        for _, hi in grants:
            if hi < lo:
                continue
            inside = sum(1 for b, a in grants if b >= lo and a <= hi)
            worst = max(worst, inside - (BURST + RPS * (hi - lo) / 1_000_000))
    return worst


def test_two_processes_share_one_gcra_rate(shared: tuple[str, str]) -> None:
    url, prefix = shared
    _enqueue_tasks(url, prefix, RATE_TASKS)
    reports = _run_children(_rate_taker, [(url, prefix), (url, prefix)])

    grants = sorted(g for report in reports for g in report)
    assert _worst_excess(grants) <= 1e-6
    # Not starved either: the burst at once, then about RPS per second.
    assert len(grants) >= BURST + int(RPS * (RATE_SECONDS - 0.5))


# -- crash: a SIGKILLed holder's slots and leases come back -------------------------------------

TTL = timedelta(seconds=1)
TTL_US = 1_000_000


def _crashing_holder(url: str, prefix: str, barrier: Any, results: Any) -> None:
    broker = RedisBroker(url, key_prefix=prefix)
    clock = redis.Redis.from_url(url)
    barrier.wait()
    leases = _claim_shared(broker, 2, TTL, workers=2).leases
    results.put(([lease.task.id for lease in leases], _server_us(clock)))
    threading.Event().wait()  # hold everything until SIGKILLed


def _poll(action: Any, deadline_us: int, clock: redis.Redis) -> tuple[Any, int]:
    """Call ``action`` until it returns something truthy; give up at server time ``deadline_us``."""
    while (now := _server_us(clock)) <= deadline_us:
        if result := action():
            return result, now
        time.sleep(0.02)
    raise AssertionError("not recovered before the deadline")


def test_a_killed_process_frees_its_slots_and_its_tasks_within_two_ttls(shared: tuple[str, str]) -> None:
    url, prefix = shared
    broker = RedisBroker(url, key_prefix=prefix)
    clock = redis.Redis.from_url(url)
    steps.enqueue(broker, [NewTask(id=task_id, type="t", queue="q") for task_id in ("crash-a", "crash-b")])
    barrier, results = SPAWN.Barrier(1), SPAWN.Queue()
    child = SPAWN.Process(target=_crashing_holder, args=(url, prefix, barrier, results))
    child.start()
    claimed_ids, held_at = results.get(timeout=CHILD_TIMEOUT)
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join(CHILD_TIMEOUT)
    assert (claimed_ids, child.exitcode) == (["crash-a", "crash-b"], -signal.SIGKILL)
    # Two tasks due now: a claim gets both only once the dead process's slots are back.
    steps.enqueue(broker, [NewTask(id=task_id, type="t", queue="q") for task_id in ("later-a", "later-b")])
    if _server_us(clock) < held_at + TTL_US // 2:
        assert _claim_shared(broker, 2, TTL, workers=2).leases == []  # still held by the dead process

    def take_both() -> list[Lease]:
        leases = _claim_shared(broker, 2, TTL, workers=2).leases
        if len(leases) < 2:
            _put_back(broker, leases)
            return []
        return leases

    taken, freed_at = _poll(take_both, held_at + 2 * TTL_US, clock)
    assert sorted(lease.task.id for lease in taken) == ["later-a", "later-b"]
    reaped, _ = _poll(lambda: broker.reap(lease_lost_max=3), held_at + 2 * TTL_US, clock)
    if len(reaped) < 2:  # the two leases ended together, but a pass may fall between them
        more, _ = _poll(lambda: broker.reap(lease_lost_max=3), held_at + 3 * TTL_US, clock)
        reaped += more
    assert sorted((t.id, t.status, t.lease_lost) for t in reaped) == [
        ("crash-a", Status.PENDING, 1),
        ("crash-b", Status.PENDING, 1),
    ]
    again = steps.claim(broker, "q", 2, TTL)
    assert sorted((lease.task.id, lease.task.claims) for lease in again) == [("crash-a", 2), ("crash-b", 2)]
    assert freed_at - held_at <= 2 * TTL_US
    broker.close()
    clock.close()
