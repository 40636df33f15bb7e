"""Submitting: one task per ``gate.submit`` call, and ``gate.submit_many`` batches."""

from __future__ import annotations

import time
from typing import NamedTuple

import anyio

from benchmarks.common import QUEUE, make_gate
from benchmarks.floors import single_inserts
from benchmarks.settings import Settings
from benchmarks.stores import isolated_store

__all__ = ["PAIRED_ROUNDS", "PairedSubmits", "submit_batch", "submit_single", "submit_single_paired"]

PAIRED_ROUNDS = 5  # alternated blocks of each side per repeat of `submit_single_paired`


class PairedSubmits(NamedTuple):
    """One repeat of `submit_single_paired`: each side's rate, and the CPU this process spent
    per call on it (every thread's, so a broker thread's share counts): where a gap to the
    floor is this process's own work, and where it is the wait for the server."""

    ours: float
    floor: float
    ours_cpu_us: float
    floor_cpu_us: float


def submit_single(backend: str, s: Settings) -> list[float]:
    """Tasks per second of up to ``n`` sequential ``await gate.submit(...)``, one run per repeat."""
    return [_run(backend, s.n, 1, s.run_cap) for _ in range(s.repeats)]


def submit_single_paired(backend: str, s: Settings) -> list[PairedSubmits]:
    """Per repeat, our rate and the floor's ``insert1`` rate (with each side's CPU per call) of
    sequential single submits and raw single inserts in alternated blocks, in one process and
    one store: seconds apart, so the machine's drift hits both sides alike. Empty for a
    backend without a floor (memory).

    Each side does up to ``n / 2`` jobs per repeat in `PAIRED_ROUNDS` blocks, within ``run_cap``.
    """
    return [pair for _ in range(s.repeats) if (pair := _paired(backend, s)) is not None]


def _paired(backend: str, s: Settings) -> PairedSubmits | None:
    with isolated_store(backend) as store:
        floor = single_inserts(store)
        if floor is None:
            return None
        gate = make_gate(store.open())
        block = max(1, s.n // (2 * PAIRED_ROUNDS))
        try:

            async def submits(count: int) -> None:
                for _ in range(count):
                    await gate.submit(QUEUE)

            async def alternate() -> PairedSubmits:
                await submits(1)  # opens connections and warms caches, as the floor's first insert
                floor.insert_single(1)
                spent = {"ours": 0.0, "floor": 0.0}
                cpu = {"ours": 0.0, "floor": 0.0}
                stop = time.perf_counter() + s.run_cap
                done = 0
                while done < PAIRED_ROUNDS * block and time.perf_counter() < stop:
                    first_ours = done // block % 2 == 0  # which side goes first alternates too
                    for side in ("ours", "floor") if first_ours else ("floor", "ours"):
                        start, start_cpu = time.perf_counter(), time.process_time()
                        if side == "ours":
                            await submits(block)
                        else:
                            floor.insert_single(block)
                        spent[side] += time.perf_counter() - start
                        cpu[side] += time.process_time() - start_cpu
                    done += block
                return PairedSubmits(
                    done / spent["ours"],
                    done / spent["floor"],
                    cpu["ours"] / done * 1e6,
                    cpu["floor"] / done * 1e6,
                )

            return anyio.run(alternate)
        finally:
            floor.close()


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
