"""Claim throughput beside many finished tasks: does a big history slow the claim path?

At the broker level (no runtime), so only the store's cost shows: ``n`` pending tasks are
drained by ``claim(k=10)`` followed by ``ack`` of each claimed task, first in a store holding
``small_finished`` completed tasks, then one holding ``big_finished`` (built in bulk, see
`benchmarks.bulk`).
"""

from __future__ import annotations

import time

from benchmarks.bulk import fill_finished
from benchmarks.common import LEASE, QUEUE, enqueue_noops
from benchmarks.settings import Settings
from benchmarks.stores import isolated_store
from taskgate.brokers.base import Broker

__all__ = ["CLAIM_K", "claim_rate"]

CLAIM_K = 10


def claim_rate(backend: str, s: Settings, finished: int) -> tuple[list[float], int, float]:
    """Claim+ack tasks per second (one sample per repeat), the finished count reached, fill time."""
    with isolated_store(backend) as store:
        started = time.perf_counter()
        reached = fill_finished(store, finished, s.fill_budget)
        fill_seconds = time.perf_counter() - started
        broker = store.open()
        samples = []
        for _ in range(s.repeats):
            left = broker.queue_length(QUEUE)  # a capped drain leaves some behind
            enqueue_noops(broker, max(0, s.n - left))
            samples.append(_drain(broker, s.n, s.run_cap))
        return samples, reached, fill_seconds


def _drain(broker: Broker, n: int, cap: float) -> float:
    start = time.perf_counter()
    stop = start + cap
    done = 0
    while done < n and time.perf_counter() < stop:
        leases = broker.claim(QUEUE, CLAIM_K, LEASE)
        if not leases:
            raise RuntimeError(f"queue ran dry after {done} of {n} tasks")
        for lease in leases:
            broker.ack(lease.task.id, lease.token, None)
        done += len(leases)
    return done / (time.perf_counter() - start)
