"""Split calls against thread hops on Redis, A/B in one process (`taskgate.brokers.split`).

``python -m benchmarks.splitcalls --what submit --rounds 8`` alternates, round by round, a
`RedisBroker` and the same broker declaring no ``split_calls`` (so `Gate` hops to a thread for
every call, as before the seventeenth round), each on a fresh key prefix, and prints the rates
and the paired ratios. Alternating in one process puts both under the same minute of a machine
whose speed drifts by a fifth within minutes. ``--what``: ``submit`` (sequential
``gate.submit``, the gate not started), ``get`` (sequential ``gate.get`` of one task, as a status
endpoint reads it), ``w10`` / ``w100`` (``n`` pre-filled no-op tasks drained by a started gate
with that many workers).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Sequence

import anyio

from benchmarks.common import QUEUE, calls_per_second, drain_rate, enqueue_noops, make_gate
from benchmarks.stores import isolated_store
from taskgate.brokers.redis import RedisBroker

__all__ = ["ThreadHops", "main", "rate"]


class ThreadHops(RedisBroker):
    """A `RedisBroker` whose calls `Gate` runs in threads (it declares no ``split_calls``)."""

    capabilities = dataclasses.replace(RedisBroker.capabilities, split_calls=False)


def rate(broker_class: type[RedisBroker], what: str, n: int) -> float:
    """Tasks per second of one run of ``what`` on a fresh key prefix."""
    with isolated_store("redis") as store:
        broker = broker_class(store.spec["url"], key_prefix=store.spec["key_prefix"])
        try:
            if what == "submit":
                return anyio.run(_submits, broker, n)
            if what == "get":
                return anyio.run(_gets, broker, n)
            enqueue_noops(broker, n)
            return anyio.run(drain_rate, broker, n, int(what.removeprefix("w")))
        finally:
            broker.close()


async def _submits(broker: RedisBroker, n: int) -> float:
    gate = make_gate(broker)
    return await calls_per_second(lambda: gate.submit(QUEUE), n)


async def _gets(broker: RedisBroker, n: int) -> float:
    gate = make_gate(broker)
    task_id = await gate.submit(QUEUE)
    return await calls_per_second(lambda: gate.get(task_id), n)


def main(argv: Sequence[str] | None = None) -> None:
    """Print each side's median and samples, then the paired ratios split / threads."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.splitcalls")
    parser.add_argument("--what", choices=["submit", "get", "w10", "w100"], default="submit")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "-n", type=int, default=0, help="tasks per run (default 2,000 submits or gets, 10,000 drained)"
    )
    args = parser.parse_args(argv)
    n = args.n or (2000 if args.what in ("submit", "get") else 10_000)
    sides: dict[str, type[RedisBroker]] = {"split": RedisBroker, "threads": ThreadHops}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for round_number in range(args.rounds):
        order = list(sides) if round_number % 2 else list(reversed(sides))
        for name in order:
            rates[name].append(rate(sides[name], args.what, n))
    for name, samples in rates.items():
        shown = " ".join(f"{x:,.0f}" for x in samples)
        print(f"{args.what} {name:7s} median {statistics.median(samples):9,.0f}/s  ({shown})")
    ratios = [a / b for a, b in zip(rates["split"], rates["threads"], strict=True)]
    paired = " ".join(f"{r:.2f}" for r in ratios)
    print(f"split / threads, paired: median {statistics.median(ratios):.2f} ({paired})")


if __name__ == "__main__":
    main()
