"""Submit -> start latency at low load: a handler's start time minus the submit call's start.

Submits are spaced ``latency_gap`` apart (uniformly random, so they do not lock step with
any poll period) and each waits for its task to start before the next.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import anyio

from benchmarks.common import QUEUE, make_gate
from benchmarks.settings import Settings
from benchmarks.stores import isolated_store
from taskgate import Task
from taskgate.brokers.base import Broker

__all__ = ["latency_cross_process", "latency_same_process", "same_process_samples"]

WARM_UP = 3  # first samples open connections and fill caches; not counted


def latency_same_process(backend: str, s: Settings) -> list[float]:
    """Milliseconds from ``submit`` to handler start, the gate running in the submitting process."""
    with isolated_store(backend) as store:
        return same_process_samples(store.open(), s)


def same_process_samples(broker: Broker, s: Settings) -> list[float]:
    """`latency_same_process` on ``broker``: ``s.latency_samples`` samples after `WARM_UP`."""
    gate = make_gate(broker)
    started: dict[str, float] = {}
    event = anyio.Event()

    async def handler(task: Task) -> None:
        started[task.id] = time.monotonic()
        event.set()

    gate.handle(QUEUE, handler)

    async def measure() -> list[float]:
        nonlocal event
        samples = []
        async with gate:
            for _ in range(WARM_UP + s.latency_samples):
                await anyio.sleep(random.uniform(*s.latency_gap))
                event = anyio.Event()
                t0 = time.monotonic()
                task_id = await gate.submit(QUEUE)
                while task_id not in started:
                    await event.wait()
                    event = anyio.Event()
                samples.append((started[task_id] - t0) * 1000)
        return samples[WARM_UP:]

    return anyio.run(measure)


def latency_cross_process(backend: str, s: Settings) -> list[float]:
    """Milliseconds from ``submit`` here to handler start in a worker process."""
    with isolated_store(backend) as store:
        gate = make_gate(store.open())
        options = json.dumps({"spec": store.spec})
        child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.child", "latency", options],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        try:
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"latency child failed to start (exit code {child.poll()})")
            readline = child.stdout.readline

            async def measure() -> list[float]:
                samples = []
                for _ in range(WARM_UP + s.latency_samples):
                    await anyio.sleep(random.uniform(*s.latency_gap))
                    t0 = time.monotonic()
                    task_id = await gate.submit(QUEUE)
                    line = await anyio.to_thread.run_sync(readline)
                    seen_id, when = line.split()
                    if seen_id != task_id:
                        raise RuntimeError(f"worker started {seen_id}, expected {task_id}")
                    samples.append((float(when) - t0) * 1000)
                return samples[WARM_UP:]

            return anyio.run(measure)
        finally:
            child.stdin.close()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
