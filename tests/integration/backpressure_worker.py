"""Processes for ``test_backpressure_multiprocess.py``: producers submitting to one limited queue,
and a worker draining it, each a `Gate` over one store.

The test starts them with multiprocessing's ``spawn`` context. A producer (`produce`) submits
``count`` tasks one by one to queue ``q`` under ``QueueConfig(max_pending, on_full)`` once
every process is ready, and answers how many went in and how many raised `QueueFullError`.
The worker (`drain`) runs handlers for the queue until the store holds ``total`` completed
tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from taskgate import Config, Filter, Gate, QueueConfig, QueueFullError, Task
from taskgate.brokers import open_broker

__all__ = ["QUEUE", "ProcessSpec", "drain", "produce"]

QUEUE = "q"
POLL = 0.02
CHILD_DEADLINE = 90.0  # a child still going by then is hung, not slow


@dataclass(frozen=True)
class ProcessSpec:
    """What one child does: where, under which limit, how many tasks (or how many to wait for)."""

    url: str
    max_pending: int
    on_full: str = "block"
    count: int = 0  # a producer's tasks; the worker's total to wait for
    hold: float = 0.005  # how long the worker's handler runs
    broker_options: dict[str, Any] = field(default_factory=dict)


def _gate(spec: ProcessSpec) -> Gate:
    broker = open_broker(spec.url, **spec.broker_options)
    queue = QueueConfig(workers=2, max_pending=spec.max_pending, on_full=spec.on_full)
    return Gate(Config(broker=broker, queues={QUEUE: queue}), poll_interval=POLL)


def produce(spec: ProcessSpec, ready: Any, answers: Any) -> None:
    """Producer entry: submit ``spec.count`` tasks once every process is ready; put
    ``(stored, refused)`` on ``answers``."""
    answers.put(anyio.run(_produce, spec, ready))


async def _produce(spec: ProcessSpec, ready: Any) -> tuple[int, int]:
    gate = _gate(spec)
    stored = refused = 0
    try:
        await anyio.to_thread.run_sync(ready.wait)
        with anyio.fail_after(CHILD_DEADLINE):
            for n in range(spec.count):
                try:
                    await gate.submit(QUEUE, n)
                except QueueFullError:
                    refused += 1
                else:
                    stored += 1
    finally:
        gate.config.broker.close()
    return stored, refused


def drain(spec: ProcessSpec, ready: Any) -> None:
    """Worker entry: run the queue's handlers until ``spec.count`` tasks are completed."""
    anyio.run(_drain, spec, ready)


async def _drain(spec: ProcessSpec, ready: Any) -> None:
    gate = _gate(spec)
    ran, all_ran = [0], anyio.Event()

    @gate.handler(QUEUE)
    async def work(task: Task) -> None:
        await anyio.sleep(spec.hold)
        ran[0] += 1
        if ran[0] == spec.count:
            all_ran.set()

    try:
        async with gate:
            await anyio.to_thread.run_sync(ready.wait)
            with anyio.fail_after(CHILD_DEADLINE):
                await all_ran.wait()
                for task in await gate.list(Filter(queue=QUEUE)):
                    await gate.wait(task.id)  # its completion written
    finally:
        gate.config.broker.close()
