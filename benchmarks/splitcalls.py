"""Split calls against thread hops, A/B in one process (`taskgate.brokers.split`).

``python -m benchmarks.splitcalls [--backend redis|pg] --what submit --rounds 8`` alternates,
round by round, the broker and the same broker declaring no ``split_calls`` (so `Gate` hops to
a thread for every call: Redis before the seventeenth round, PostgreSQL before the twentieth),
each on a fresh store, and prints the rates and the paired ratios. Alternating in one process
puts both under the same minute of a machine whose speed drifts by a fifth within minutes.
``--what``: ``submit`` (sequential ``gate.submit``, the gate not started), ``get`` (sequential
``gate.get`` of one task, as a status endpoint reads it), ``w10`` / ``w100`` (``n`` pre-filled
no-op tasks drained by a started gate with that many workers), ``latency`` (same-process
submit -> start p50 in ms, as the runner measures it; the paired ratio is then threads / split).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from benchmarks.cli import choose
from benchmarks.common import QUEUE, alternate, calls_per_second, drain_rate, enqueue_noops, make_gate
from benchmarks.latency import same_process_samples
from benchmarks.settings import Settings
from benchmarks.stores import isolated_store
from taskgate.brokers.base import Broker
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.sql import SQLBroker

__all__ = ["SQLThreadHops", "ThreadHops", "main", "measure"]


class ThreadHops(RedisBroker):
    """A `RedisBroker` whose calls `Gate` runs in threads (it declares no ``split_calls``)."""

    capabilities = dataclasses.replace(RedisBroker.capabilities, split_calls=False)


class SQLThreadHops(SQLBroker):
    """An `SQLBroker` whose calls `Gate` runs in threads (it declares no ``split_calls``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.capabilities = dataclasses.replace(self.capabilities, split_calls=False)


# backend -> (split side, thread side), each opened on an isolated store's spec
_SIDES: dict[str, tuple[Callable[[dict[str, Any]], Broker], Callable[[dict[str, Any]], Broker]]] = {
    "redis": (
        lambda spec: RedisBroker(spec["url"], key_prefix=spec["key_prefix"]),
        lambda spec: ThreadHops(spec["url"], key_prefix=spec["key_prefix"]),
    ),
    "postgresql": (lambda spec: SQLBroker(spec["url"]), lambda spec: SQLThreadHops(spec["url"])),
}


def measure(backend: str, split: bool, what: str, n: int) -> float:
    """One run of ``what`` on a fresh store: tasks per second, or the latency p50 in ms."""
    with isolated_store(backend) as store:
        broker = _SIDES[backend][0 if split else 1](store.spec)
        try:
            if what == "latency":
                return statistics.median(same_process_samples(broker, Settings(latency_samples=n)))
            if what == "submit":
                return anyio.run(_submits, broker, n)
            if what == "get":
                return anyio.run(_gets, broker, n)
            enqueue_noops(broker, n)
            return anyio.run(drain_rate, broker, n, int(what.removeprefix("w")))
        finally:
            broker.close()


async def _submits(broker: Broker, n: int) -> float:
    gate = make_gate(broker)
    return await calls_per_second(lambda: gate.submit(QUEUE), n)


async def _gets(broker: Broker, n: int) -> float:
    gate = make_gate(broker)
    task_id = await gate.submit(QUEUE)
    return await calls_per_second(lambda: gate.get(task_id), n)


def main(argv: Sequence[str] | None = None) -> None:
    """Print each side's median and samples, then the paired ratios (`alternate`)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.splitcalls")
    parser.add_argument("--backend", default="redis", help="redis or postgresql (pg)")
    parser.add_argument("--what", choices=["submit", "get", "w10", "w100", "latency"], default="submit")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "-n",
        type=int,
        default=0,
        help="calls, tasks or latency samples per run (default 2,000 / 10,000 / 40)",
    )
    args = parser.parse_args(argv)
    (backend,) = choose(args.backend, list(_SIDES), "backend with split calls")
    n = args.n or {"submit": 2000, "get": 2000, "latency": 40}.get(args.what, 10_000)
    alternate(
        ["split", "threads"],
        lambda side: measure(backend, side == "split", args.what, n),
        args.what,
        args.rounds,
        latency=args.what == "latency",
    )


if __name__ == "__main__":
    main()
