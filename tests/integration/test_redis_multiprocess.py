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

from taskgate.brokers.base import NewTask
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.task import Filter, Status

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
    while leases := broker.claim("q", 10, timedelta(minutes=5)):
        for lease in leases:
            broker.ack(lease.task.id, lease.token, None)
            mine.append(lease.task.id)
    broker.close()
    results.put(mine)


def test_four_processes_claim_two_thousand_tasks_exactly_once(shared: tuple[str, str]) -> None:
    url, prefix = shared
    broker = RedisBroker(url, key_prefix=prefix)
    ids = [f"task-{i:04d}" for i in range(2000)]
    broker.enqueue([NewTask(id=i, type="t", queue="q") for i in ids])

    reports = _run_children(_claimer, [(url, prefix)] * 4)

    claimed = [task_id for report in reports for task_id in report]
    assert len(claimed) == len(ids)
    assert sorted(claimed) == ids
    assert broker.counts() == {"t": {Status.COMPLETED: 2000}}
    assert {t.claims for t in broker.list(Filter(type="t"))} == {1}
    broker.close()


# -- slots: capacity 2 is global across two processes ------------------------------------------

SLOT_ROUNDS = 300


def _slot_holder(url: str, prefix: str, want: int, barrier: Any, results: Any) -> None:
    broker = RedisBroker(url, key_prefix=prefix)
    clock = redis.Redis.from_url(url)
    held: list[tuple[int, int, int]] = []
    denied = 0
    barrier.wait()
    for _ in range(SLOT_ROUNDS):
        tokens = broker.acquire_slots("q", 2, want, timedelta(seconds=30))
        if not tokens:
            denied += 1
            continue
        # [start, end] lies inside the true holding interval: read after acquire, before release.
        start = _server_us(clock)
        end = _server_us(clock)
        broker.release_slots("q", tokens)
        held.append((start, end, len(tokens)))
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
    reports = _run_children(_slot_holder, [(url, prefix, 1), (url, prefix, 2)])

    intervals = [interval for held, _ in reports for interval in held]
    assert all(held for held, _ in reports), "each process must have held slots at some point"
    assert sum(denied for _, denied in reports) > 0, "the processes never contended"
    assert _max_overlap(intervals) == 2


# -- rate: GCRA rps=5 shared by two processes --------------------------------------------------

RPS = 5.0
BURST = 3
RATE_SECONDS = 1.5


def _rate_taker(url: str, prefix: str, barrier: Any, results: Any) -> None:
    broker = RedisBroker(url, key_prefix=prefix)
    clock = redis.Redis.from_url(url)
    grants: list[tuple[int, int]] = []
    barrier.wait()
    stop = _server_us(clock) + int(RATE_SECONDS * 1_000_000)
    while (before := _server_us(clock)) < stop:
        granted, retry_after = broker.take_rate("q", RPS, BURST, 1)
        after = _server_us(clock)
        if granted:
            grants.append((before, after))
        else:
            # What a rate-limited caller does: wait as told (capped, to keep contending).
            time.sleep(min(retry_after, 0.05))
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
    reports = _run_children(_rate_taker, [(url, prefix), (url, prefix)])

    grants = sorted(g for report in reports for g in report)
    assert _worst_excess(grants) <= 1e-6
    # Not starved either: the burst at once, then about RPS per second.
    assert len(grants) >= BURST + int(RPS * (RATE_SECONDS - 0.5))


# -- crash: a SIGKILLed holder's slots and lease come back -------------------------------------

TTL = timedelta(seconds=1)
TTL_US = 1_000_000


def _crashing_holder(url: str, prefix: str, barrier: Any, results: Any) -> None:
    broker = RedisBroker(url, key_prefix=prefix)
    clock = redis.Redis.from_url(url)
    barrier.wait()
    tokens = broker.acquire_slots("q", 2, 2, TTL)
    (lease,) = broker.claim("q", 1, TTL)
    results.put((tokens, lease.task.id, _server_us(clock)))
    threading.Event().wait()  # hold everything until SIGKILLed


def _poll(action: Any, deadline_us: int, clock: redis.Redis) -> tuple[Any, int]:
    """Call ``action`` until it returns something truthy; give up at server time ``deadline_us``."""
    while (now := _server_us(clock)) <= deadline_us:
        if result := action():
            return result, now
        time.sleep(0.02)
    raise AssertionError("not recovered before the deadline")


def test_a_killed_process_frees_its_slots_and_its_task_within_two_ttls(shared: tuple[str, str]) -> None:
    url, prefix = shared
    broker = RedisBroker(url, key_prefix=prefix)
    clock = redis.Redis.from_url(url)
    (task,) = broker.enqueue([NewTask(id="crash-me", type="t", queue="q")])
    barrier, results = SPAWN.Barrier(1), SPAWN.Queue()
    child = SPAWN.Process(target=_crashing_holder, args=(url, prefix, barrier, results))
    child.start()
    tokens, claimed_id, held_at = results.get(timeout=CHILD_TIMEOUT)
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join(CHILD_TIMEOUT)
    assert (len(tokens), claimed_id, child.exitcode) == (2, task.id, -signal.SIGKILL)
    if _server_us(clock) < held_at + TTL_US // 2:
        assert broker.acquire_slots("q", 2, 1, TTL) == []  # still held by the dead process

    def take_both() -> list[str]:
        got = broker.acquire_slots("q", 2, 2, TTL)
        if len(got) < 2:
            broker.release_slots("q", got)
            return []
        return got

    _, freed_at = _poll(take_both, held_at + 2 * TTL_US, clock)
    (reaped,), _ = _poll(lambda: broker.reap(lease_lost_max=3), held_at + 2 * TTL_US, clock)
    assert (reaped.id, reaped.status, reaped.lease_lost) == (task.id, Status.PENDING, 1)
    (again,) = broker.claim("q", 1, TTL)
    assert (again.task.id, again.task.claims) == (task.id, 2)
    assert freed_at - held_at <= 2 * TTL_US
    broker.close()
    clock.close()
