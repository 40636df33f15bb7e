"""The held connection against a pooled checkout per call, A/B in one process.

``python -m benchmarks.heldconn [--backend pg|sqlite|mariadb] --what submit --rounds 8``
alternates, round by round, an `SQLBroker` and the same broker holding no connection, so that
every call checks a pooled one out and back in (as before the nineteenth round,
`taskgate.brokers.sql.held`), each on a fresh database, and prints the rates and the paired
ratios. ``--what``: ``submit``
(sequential ``gate.submit``, the gate not started), ``get`` (sequential ``gate.get`` of one
task), ``w10`` / ``w100`` (``n`` pre-filled no-op tasks drained by a started gate with that
many workers), ``latency`` (same-process submit -> start p50 in ms, as the runner measures it;
the paired ratio is then pooled / held, so above 1 means faster with the held connection too).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

import anyio

from benchmarks.cli import choose
from benchmarks.common import QUEUE, alternate, calls_per_second, drain_rate, enqueue_noops, make_gate
from benchmarks.latency import same_process_samples
from benchmarks.settings import Settings
from benchmarks.stores import isolated_store
from taskgate.brokers.sql import SQLBroker

__all__ = ["PooledCalls", "main", "measure"]


class PooledCalls(SQLBroker):
    """An `SQLBroker` that holds no connection: every call takes a pooled one (and nothing is
    split on PostgreSQL, since split calls go on the held connection: for the hold alone,
    compare `benchmarks.splitcalls`' thread side with this)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held = None


def measure(broker_class: type[SQLBroker], backend: str, what: str, n: int) -> float:
    """One run of ``what`` on a fresh database: tasks per second, or the latency p50 in ms."""
    with isolated_store(backend) as store:
        broker = broker_class(store.spec["url"])
        try:
            if what == "latency":
                return statistics.median(same_process_samples(broker, Settings(latency_samples=n)))
            if what in ("submit", "get"):
                return anyio.run(_calls, broker, what, n)
            enqueue_noops(broker, n)
            return anyio.run(drain_rate, broker, n, int(what.removeprefix("w")))
        finally:
            broker.close()


async def _calls(broker: SQLBroker, what: str, n: int) -> float:
    gate = make_gate(broker)
    if what == "submit":
        return await calls_per_second(lambda: gate.submit(QUEUE), n)
    task_id = await gate.submit(QUEUE)
    return await calls_per_second(lambda: gate.get(task_id), n)


def main(argv: Sequence[str] | None = None) -> None:
    """Print each side's median and samples, then the paired ratios (`alternate`)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.heldconn")
    parser.add_argument("--backend", default="postgresql", help="postgresql (pg), sqlite or mariadb")
    parser.add_argument("--what", choices=["submit", "get", "w10", "w100", "latency"], default="submit")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "-n", type=int, default=0, help="calls, tasks or latency samples per run (default 1,000 / 5,000 / 40)"
    )
    args = parser.parse_args(argv)
    (backend,) = choose(args.backend, ["postgresql", "sqlite", "mariadb"], "SQL backend")
    n = args.n or {"submit": 1000, "get": 1000, "latency": 40}.get(args.what, 5000)
    sides: dict[str, type[SQLBroker]] = {"held": SQLBroker, "pooled": PooledCalls}
    alternate(
        list(sides),
        lambda side: measure(sides[side], backend, args.what, n),
        args.what,
        args.rounds,
        latency=args.what == "latency",
    )


if __name__ == "__main__":
    main()
