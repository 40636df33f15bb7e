"""Tasks of mixed priorities against the same tasks all of priority 0, A/B in one process.

``python -m benchmarks.priorities [--backend pg] --rounds 8 [-n 10000] [--workers 10]``
alternates, round by round, a drain of ``n`` pre-filled no-op tasks whose priorities are drawn
from 0 to 9 at random (seeded, `benchmarks.processing.PRIORITY_SEED`) and a drain of as many of
priority 0, each by a started gate with ``workers`` on a fresh store, and prints the rates and
the paired ratios (above 1: the mixed priorities are faster). ``--cpu``: tasks per second of
this process's CPU time instead of wall time (see `benchmarks.trees`). The runner's
``limits.priorities`` is the same figure, interleaved with the other limit variants.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

import anyio

from benchmarks.cli import choose
from benchmarks.common import alternate, drain_rate, enqueue_noops
from benchmarks.processing import PRIORITY_SEED
from benchmarks.stores import BACKENDS, isolated_store

__all__ = ["main", "measure"]


def measure(backend: str, mixed: bool, n: int, workers: int, *, cpu: bool = False) -> float:
    """Tasks per second (of this process's CPU time with ``cpu``) of one drain of ``n`` tasks,
    of mixed priorities or all of priority 0."""
    with isolated_store(backend) as store:
        broker = store.open()
        try:
            enqueue_noops(broker, n, priorities=random.Random(PRIORITY_SEED) if mixed else None)
            started = time.process_time()
            rate = anyio.run(drain_rate, broker, n, workers)
            return n / (time.process_time() - started) if cpu else rate
        finally:
            broker.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Print each side's median and samples, then the paired ratios (`alternate`)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.priorities")
    parser.add_argument("--backend", default="memory", help="one of memory,sqlite,pg,mariadb,redis")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("-n", type=int, default=10_000, help="tasks per drain")
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--cpu", action="store_true", help="rates per second of this process's CPU time")
    args = parser.parse_args(argv)
    (backend,) = choose(args.backend, list(BACKENDS), "backend")
    alternate(
        ["mixed", "zero"],
        lambda side: measure(backend, side == "mixed", args.n, args.workers, cpu=args.cpu),
        f"{backend} w{args.workers}{' per CPU s' if args.cpu else ''}",
        args.rounds,
        latency=False,
    )


if __name__ == "__main__":
    main()
