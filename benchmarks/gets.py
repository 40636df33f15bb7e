"""Reads of one task, as a status endpoint makes them: ``gate.get`` per backend.

``python -m benchmarks.gets [--backend pg,mariadb,redis,sqlite,memory] [-n 2000] [--repeats 3]``
stores one task in an isolated store, then times ``n`` sequential ``await gate.get(id)`` (the
gate not started, as in a web process that only submits and reads) and, beside it, ``n`` calls
of the broker's own ``get`` on the calling thread (what the call costs without the runtime's
way of calling it). Prints one line per backend: the medians of ``repeats`` runs and the
samples. Run it from two trees in turn to compare two versions of the code.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import anyio

from benchmarks.common import QUEUE, make_gate
from benchmarks.stores import BACKENDS, isolated_store
from taskgate.brokers.base import Broker

__all__ = ["main", "rates"]

_ALIASES = {"pg": "postgresql", "postgres": "postgresql", "mysql": "mariadb", "mem": "memory"}


def rates(backend: str, n: int) -> tuple[float, float]:
    """(``gate.get`` per second, the broker's ``get`` per second) on a fresh store."""
    with isolated_store(backend) as store:
        broker = store.open()
        return anyio.run(_gets, broker, n)


async def _gets(broker: Broker, n: int) -> tuple[float, float]:
    gate = make_gate(broker)
    task_id = await gate.submit(QUEUE)
    for _ in range(3):  # the first calls open connections and prepare statements
        await gate.get(task_id)
    start = time.perf_counter()
    for _ in range(n):
        await gate.get(task_id)
    through_gate = n / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(n):
        broker.get(task_id)
    direct = n / (time.perf_counter() - start)
    return through_gate, direct


def main(argv: Sequence[str] | None = None) -> None:
    """Print, per backend, the median rates of ``gate.get`` and of the broker's ``get``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gets")
    parser.add_argument("--backend", default="postgresql,mariadb,redis,sqlite,memory")
    parser.add_argument("-n", type=int, default=2000, help="reads per run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    backends = [_ALIASES.get(name, name) for name in args.backend.split(",") if name]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(BACKENDS)}")
    for backend in backends:
        samples = [rates(backend, args.n) for _ in range(args.repeats)]
        gate_rates, direct_rates = ([sample[k] for sample in samples] for k in (0, 1))
        shown = " ".join(f"{x:,.0f}" for x in gate_rates)
        print(
            f"{backend:10s} gate.get {statistics.median(gate_rates):9,.0f}/s ({shown})"
            f"  broker.get {statistics.median(direct_rates):9,.0f}/s"
        )


if __name__ == "__main__":
    main()
