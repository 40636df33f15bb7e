"""Pieces every benchmark uses: gates on a store, pre-filled queues, waiting for completions."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import anyio

from taskgate import Config, Gate, QueueConfig, Status, Task
from taskgate.brokers.base import Broker, NewTask
from taskgate.brokers.params import Claim, Complete, Settle, Submit
from taskgate.ids import new_id

__all__ = [
    "LEASE",
    "QUEUE",
    "Countdown",
    "alternate",
    "calls_per_second",
    "completed_count",
    "completed_parent",
    "drain_rate",
    "enqueue_noops",
    "make_gate",
    "wait_completed",
]

QUEUE = "noop"  # the type and the queue of every benchmark task
LEASE = timedelta(seconds=60)
ENQUEUE_CHUNK = 1000


def make_gate(broker: Broker, *, workers: int = 10, **queue_options: Any) -> Gate:
    """A gate whose queue ``noop`` has ``workers`` and ``queue_options`` (rps, quota, …)."""
    return Gate(Config(broker=broker, queues={QUEUE: QueueConfig(workers=workers, **queue_options)}))


def enqueue_noops(
    broker: Broker, n: int, *, depends_on: Sequence[str] = (), priorities: random.Random | None = None
) -> None:
    """Store ``n`` pending no-op tasks directly through the broker (set-up, not measured); with
    ``priorities``, each of a priority from 0 to 9 drawn from it."""
    for start in range(0, n, ENQUEUE_CHUNK):
        count = min(ENQUEUE_CHUNK, n - start)
        tasks = tuple(
            NewTask(
                id=new_id(),
                type=QUEUE,
                queue=QUEUE,
                depends_on=tuple(depends_on),
                priority=0 if priorities is None else priorities.randrange(10),
            )
            for _ in range(count)
        )
        broker.submit(Submit(tasks, snapshots=False))


def completed_parent(broker: Broker) -> str:
    """A completed task of type ``parent``, for children whose dependency is already met."""
    parent = NewTask(id=new_id(), type="parent", queue="parent")
    broker.submit(Submit((parent,), snapshots=False))
    (lease,) = broker.claim(Claim("parent", 1, LEASE)).leases
    broker.settle(Settle((Complete(parent.id, lease.token),), snapshots=False))
    return parent.id


def completed_count(broker: Broker, task_type: str = QUEUE) -> int:
    """How many tasks of ``task_type`` are completed, from the broker's counters."""
    return broker.counts().get(task_type, {}).get(Status.COMPLETED, 0)


def wait_completed(broker: Broker, n: int, *, poll: float, until: float) -> tuple[int, float]:
    """Block until ``n`` no-op tasks are completed or ``perf_counter()`` passes ``until``.

    Returns how many were completed and the ``perf_counter`` time that count was read.
    """
    while True:
        done = completed_count(broker)
        now = time.perf_counter()
        if done >= n or now >= until:
            return done, now
        time.sleep(poll)


class Countdown:
    """A no-op handler that sets ``done`` after ``n`` calls (in this process)."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.done = anyio.Event()

    async def __call__(self, task: Task) -> None:
        """The handler: count the call, nothing else."""
        self.left -= 1
        if self.left == 0:
            self.done.set()


async def calls_per_second(call: Callable[[], Awaitable[object]], n: int) -> float:
    """Calls per second of ``n`` sequential awaits of ``call()``, after two to warm up."""
    for _ in range(2):  # the first calls open the connections
        await call()
    start = time.perf_counter()
    for _ in range(n):
        await call()
    return n / (time.perf_counter() - start)


async def drain_rate(broker: Broker, n: int, workers: int) -> float:
    """Tasks per second of a started gate with ``workers`` draining ``n`` pre-filled no-ops."""
    gate = make_gate(broker, workers=workers)
    countdown = Countdown(n)
    gate.handle(QUEUE, countdown)
    start = time.perf_counter()
    async with gate:
        await countdown.done.wait()
    return n / (time.perf_counter() - start)


def alternate(
    sides: Sequence[str], measure: Callable[[str], float], what: str, rounds: int, *, latency: bool
) -> None:
    """Measure ``sides`` round by round in alternating order (so the machine's drift hits both
    alike) and print each side's median and samples, then the paired ratios of the first side
    to the second -- inverted for a latency, so above 1 always means the first side is faster."""
    first, second = sides
    values: dict[str, list[float]] = {name: [] for name in sides}
    for round_number in range(rounds):
        order = list(sides) if round_number % 2 else list(reversed(sides))
        for name in order:
            values[name].append(measure(name))
    unit = "ms p50" if latency else "/s"
    width = max(len(name) for name in sides)
    for name, samples in values.items():
        shown = " ".join(f"{x:,.2f}" if latency else f"{x:,.0f}" for x in samples)
        print(f"{what} {name:{width}s} median {statistics.median(samples):9,.2f} {unit}  ({shown})")
    pairs = zip(values[first], values[second], strict=True)
    ratios = [b / a if latency else a / b for a, b in pairs]
    paired = " ".join(f"{r:.2f}" for r in ratios)
    print(
        f"{first} vs {second} (above 1: {first} faster), paired: "
        f"median {statistics.median(ratios):.2f} ({paired})"
    )
