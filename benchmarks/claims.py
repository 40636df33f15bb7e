"""Claim throughput beside many finished tasks: does a big history -- or pruning it -- slow
the claim path?

At the broker level (no runtime), so only the store's cost shows: ``n`` pending tasks are
drained by ``claim(k=10)`` followed by a ``settle`` completing each claimed task on its own,
in a store holding ``small_finished`` completed tasks, in one holding ``big_finished`` and in
one holding ``pruning_finished`` (built in bulk, see `benchmarks.bulk`) while a second thread
prunes it as a gate's reaper does (`taskgate.runtime.retention.prune_pass`: up to
``MAX_BATCHES`` `Broker.prune` calls of ``PRUNE_BATCH`` tasks, back to back) once a second --
the reaper's cadence with a 2 s ``lease_ttl``, faster than any usual setting -- the stores
drained in turn, repeat by repeat.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from benchmarks.bulk import fill_finished
from benchmarks.common import LEASE, QUEUE, enqueue_noops
from benchmarks.settings import Settings
from benchmarks.stores import isolated_store
from taskgate.brokers.base import Broker
from taskgate.brokers.params import Claim, Complete, Prune, Settle
from taskgate.runtime.retention import MAX_BATCHES, PRUNE_BATCH
from taskgate.testing import steps

__all__ = ["CLAIM_K", "ClaimRun", "claim_rates"]

CLAIM_K = 10
# What a reaper pass prunes: every completed task, the drained ones too as they finish (the
# memory store's are as young as those: it is filled through its verbs, on the system clock).
PRUNE = Prune(("completed",), limit=PRUNE_BATCH)
PRUNE_EVERY = 1.0  # seconds between passes


@dataclass
class ClaimRun:
    """One store's figure: claim+ack tasks per second per repeat, finished count reached, fill time."""

    reached: int
    fill_seconds: float
    samples: list[float] = field(default_factory=list)
    pruned: int = 0  # tasks pruned during the drains (a pruning store)


def claim_rates(backend: str, s: Settings, finished: Sequence[tuple[int, bool]]) -> list[ClaimRun]:
    """A store per entry of ``finished`` (that many completed tasks; pruned meanwhile or not),
    drained in turn per repeat.

    The stores' drains are interleaved, repeat by repeat, so drift in the machine's load hits
    every size alike (measured one store after the other, the second's figure moved with the
    minute: the memory broker's 1M store read 58 % of its 10k store, 94 to 103 % interleaved).
    """
    with contextlib.ExitStack() as stack:
        brokers, runs = [], []
        for count, _ in finished:
            store = stack.enter_context(isolated_store(backend))
            started = time.perf_counter()
            reached = fill_finished(store, count, s.fill_budget)
            runs.append(ClaimRun(reached=reached, fill_seconds=time.perf_counter() - started))
            brokers.append(store.open())
        for _ in range(s.repeats):
            for broker, run, (_, pruning) in zip(brokers, runs, finished, strict=True):
                left = steps.queue_length(broker, QUEUE)  # a capped drain leaves some behind
                enqueue_noops(broker, max(0, s.n - left))
                with _pruning(broker, run) if pruning else contextlib.nullcontext():
                    run.samples.append(_drain(broker, s.n, s.run_cap))
        return runs


@contextlib.contextmanager
def _pruning(broker: Broker, run: ClaimRun) -> Iterator[None]:
    """Prune ``broker`` in a thread, a reaper's pass a second, while the block runs; count
    what went."""
    stop = threading.Event()

    def prune() -> None:
        while not stop.is_set():
            for _ in range(MAX_BATCHES):
                gone = broker.prune(PRUNE)
                run.pruned += gone
                if gone < PRUNE.limit:
                    break
            stop.wait(PRUNE_EVERY)

    thread = threading.Thread(target=prune, name="pruner")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


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
