"""Claim throughput beside many finished tasks: does a big history slow the claim path?

At the broker level (no runtime), so only the store's cost shows: ``n`` pending tasks are
drained by ``claim(k=10)`` followed by a ``settle`` completing each claimed task on its own,
in a store holding ``small_finished`` completed tasks and in one holding ``big_finished``
(built in bulk, see `benchmarks.bulk`), the two drained in turn, repeat by repeat.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.bulk import fill_finished
from benchmarks.common import LEASE, QUEUE, enqueue_noops
from benchmarks.settings import Settings
from benchmarks.stores import isolated_store
from taskgate.brokers.base import Broker
from taskgate.brokers.params import Claim, Complete, Settle
from taskgate.testing import steps

__all__ = ["CLAIM_K", "ClaimRun", "claim_rates"]

CLAIM_K = 10


@dataclass
class ClaimRun:
    """One store's figure: claim+ack tasks per second per repeat, finished count reached, fill time."""

    reached: int
    fill_seconds: float
    samples: list[float] = field(default_factory=list)


def claim_rates(backend: str, s: Settings, finished: Sequence[int]) -> list[ClaimRun]:
    """A store per entry of ``finished`` (that many completed tasks), drained in turn per repeat.

    The stores' drains are interleaved, repeat by repeat, so drift in the machine's load hits
    every size alike (measured one store after the other, the second's figure moved with the
    minute: the memory broker's 1M store read 58 % of its 10k store, 94 to 103 % interleaved).
    """
    with contextlib.ExitStack() as stack:
        brokers, runs = [], []
        for count in finished:
            store = stack.enter_context(isolated_store(backend))
            started = time.perf_counter()
            reached = fill_finished(store, count, s.fill_budget)
            runs.append(ClaimRun(reached=reached, fill_seconds=time.perf_counter() - started))
            brokers.append(store.open())
        for _ in range(s.repeats):
            for broker, run in zip(brokers, runs, strict=True):
                left = steps.queue_length(broker, QUEUE)  # a capped drain leaves some behind
                enqueue_noops(broker, max(0, s.n - left))
                run.samples.append(_drain(broker, s.n, s.run_cap))
        return runs


def _drain(broker: Broker, n: int, cap: float) -> float:
    start = time.perf_counter()
    stop = start + cap
    done = 0
    while done < n and time.perf_counter() < stop:
        leases = broker.claim(Claim(QUEUE, CLAIM_K, LEASE)).leases
        if not leases:
            raise RuntimeError(f"queue ran dry after {done} of {n} tasks")
        for lease in leases:
            broker.settle(Settle((Complete(lease.task.id, lease.token),)))
        done += len(leases)
    return done / (time.perf_counter() - start)
