"""Submitting: one task per ``gate.submit`` call, and ``gate.submit_many`` batches."""

from __future__ import annotations

import time

import anyio

from benchmarks.common import QUEUE, make_gate
from benchmarks.settings import Settings
from benchmarks.stores import isolated_store

__all__ = ["submit_batch", "submit_single"]


def submit_single(backend: str, s: Settings) -> list[float]:
    """Tasks per second of up to ``n`` sequential ``await gate.submit(...)``, one run per repeat."""
    return [_run(backend, s.n, 1, s.run_cap) for _ in range(s.repeats)]


def submit_batch(backend: str, s: Settings) -> list[float]:
    """Tasks per second of ``gate.submit_many`` with ``batch`` payloads per call."""
    return [_run(backend, s.batch_jobs, s.batch, s.run_cap) for _ in range(s.repeats)]


def _run(backend: str, n: int, batch: int, cap: float) -> float:
    with isolated_store(backend) as store:
        gate = make_gate(store.open())
        payloads = [None] * batch

        async def submit_all() -> float:
            await gate.submit(QUEUE)  # first call opens connections and warms caches
            start = time.perf_counter()
            stop = start + cap
            done = 0
            while done < n and time.perf_counter() < stop:
                if batch == 1:
                    await gate.submit(QUEUE)
                else:
                    await gate.submit_many(QUEUE, payloads)
                done += batch
            return done / (time.perf_counter() - start)

        return anyio.run(submit_all)
