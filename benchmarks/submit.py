"""Submitting: one task per ``gate.submit`` call, and ``gate.submit_many`` batches."""

from __future__ import annotations

import time

import anyio

from benchmarks.common import QUEUE, make_gate
from benchmarks.settings import Settings
from benchmarks.stores import isolated_store

__all__ = ["submit_batch", "submit_single"]


def submit_single(backend: str, s: Settings) -> list[float]:
    """Tasks per second of ``n`` sequential ``await gate.submit(...)``, one run per repeat."""
    return [_run(backend, s.n, 1) for _ in range(s.repeats)]


def submit_batch(backend: str, s: Settings) -> list[float]:
    """Tasks per second of ``gate.submit_many`` with ``batch`` payloads per call."""
    return [_run(backend, s.batch_jobs, s.batch) for _ in range(s.repeats)]


def _run(backend: str, n: int, batch: int) -> float:
    with isolated_store(backend) as store:
        gate = make_gate(store.open())

        async def submit_all() -> float:
            await gate.submit(QUEUE)  # first call opens connections and warms caches
            start = time.perf_counter()
            if batch == 1:
                for _ in range(n):
                    await gate.submit(QUEUE)
            else:
                payloads = [None] * batch
                for _ in range(n // batch):
                    await gate.submit_many(QUEUE, payloads)
            return n / (time.perf_counter() - start)

        return anyio.run(submit_all)
