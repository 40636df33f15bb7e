"""Tasks of mixed priorities against the same tasks all of priority 0, A/B in one process.

``python -m benchmarks.priorities [--backend pg] --rounds 8 [-n 10000] [--workers 10]``
alternates, round by round, a drain of ``n`` pre-filled no-op tasks whose priorities are drawn
from 0 to 9 at random (seeded, `benchmarks.processing.PRIORITY_SEED`) and a drain of as many of
priority 0, each by a started gate with ``workers`` on a fresh store, and prints the rates and
the paired ratios (above 1: the mixed priorities are faster). The runner's ``limits.priorities``
is the same figure, interleaved with the other limit variants.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence

import anyio

from benchmarks.cli import choose
from benchmarks.common import alternate, drain_rate, enqueue_noops
from benchmarks.processing import PRIORITY_SEED
from benchmarks.stores import BACKENDS, isolated_store

__all__ = ["main", "measure"]


def measure(backend: str, mixed: bool, n: int, workers: int) -> float:
    """Tasks per second of one drain of ``n`` tasks, of mixed priorities or all of priority 0."""
    with isolated_store(backend) as store:
        broker = store.open()
        try:
            enqueue_noops(broker, n, priorities=random.Random(PRIORITY_SEED) if mixed else None)
            return anyio.run(drain_rate, broker, n, workers)
        finally:
            broker.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Print each side's median and samples, then the paired ratios (`alternate`)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.priorities")
    parser.add_argument("--backend", default="memory", help="one of memory,sqlite,pg,mariadb,redis")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("-n", type=int, default=10_000, help="tasks per drain")
    parser.add_argument("--workers", type=int, default=10)
    args = parser.parse_args(argv)
    (backend,) = choose(args.backend, list(BACKENDS), "backend")
    alternate(
        ["mixed", "zero"],
        lambda side: measure(backend, side == "mixed", args.n, args.workers),
        f"{backend} w{args.workers}",
        args.rounds,
        latency=False,
    )


if __name__ == "__main__":
    main()
