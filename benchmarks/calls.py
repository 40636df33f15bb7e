"""Single API calls as a web process makes them, per backend: reads and submits of one task.

``python -m benchmarks.calls [--backend pg,mariadb,redis,sqlite,memory] [--what get,submit,…]
[-n 1000] [--repeats 3]`` times ``n`` sequential awaited calls on a gate that is not started
(as in a web process that only submits and reads), each run on a fresh isolated store, and
prints one line per backend and call: the median rate of ``repeats`` runs and the samples.
``--what``:

- ``get``: ``gate.get`` of one stored task (a status endpoint);
- ``list``: ``gate.list`` of the queue's first 20 tasks (a status page);
- ``submit``: ``gate.submit`` of a task with no options;
- ``submit_key``: ``gate.submit`` with a new ``business_key`` each time (idempotent submits);
- ``submit_child``: ``gate.submit`` with ``depends_on`` a pending parent (a pipeline step);
- ``cancel``: ``gate.cancel`` of a pending task (stored before the timing starts).

Run it from two trees in turn to compare two versions of the code.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence

import anyio

from benchmarks.cli import choose
from benchmarks.common import QUEUE, make_gate
from benchmarks.stores import BACKENDS, isolated_store
from taskgate import Gate

__all__ = ["CALLS", "main", "rate"]


async def _get(gate: Gate, tasks: list[str], n: int) -> None:
    await gate.get(tasks[0])


async def _list(gate: Gate, tasks: list[str], n: int) -> None:
    await gate.list(queue=QUEUE, limit=20)


async def _submit(gate: Gate, tasks: list[str], n: int) -> None:
    await gate.submit(QUEUE)


async def _submit_key(gate: Gate, tasks: list[str], n: int) -> None:
    await gate.submit(QUEUE, business_key=f"key-{n}")


async def _submit_child(gate: Gate, tasks: list[str], n: int) -> None:
    await gate.submit(QUEUE, depends_on=[tasks[0]])


async def _cancel(gate: Gate, tasks: list[str], n: int) -> None:
    await gate.cancel(tasks[n + 4])  # tasks[0] is the others' parent; -3..-1 warm up


# name -> the n-th call (n from -3: three calls to warm up), given pending tasks stored before
Call = Callable[[Gate, list[str], int], Awaitable[None]]
CALLS: dict[str, Call] = {
    "get": _get,
    "list": _list,
    "submit": _submit,
    "submit_key": _submit_key,
    "submit_child": _submit_child,
    "cancel": _cancel,
}


def rate(backend: str, what: str, n: int) -> float:
    """Calls of ``what`` per second on a fresh store of ``backend``."""
    with isolated_store(backend) as store:
        return anyio.run(_timed, make_gate(store.open()), what, n)


async def _timed(gate: Gate, what: str, n: int) -> float:
    call = CALLS[what]
    stored = n + 4 if what == "cancel" else 20 if what == "list" else 1
    tasks = await gate.submit_many(QUEUE, [None] * stored)
    for warm_up in range(-3, 0):  # the first calls open connections and prepare statements
        await call(gate, tasks, warm_up)
    start = time.perf_counter()
    for number in range(n):
        await call(gate, tasks, number)
    return n / (time.perf_counter() - start)


def main(argv: Sequence[str] | None = None) -> None:
    """Print, per backend and call, the median rate and the samples."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calls")
    parser.add_argument("--backend", default="postgresql,mariadb,redis,sqlite,memory")
    parser.add_argument("--what", default=",".join(CALLS), help=f"any of {', '.join(CALLS)}")
    parser.add_argument("-n", type=int, default=1000, help="calls per run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    backends = choose(args.backend, BACKENDS, "backend")
    calls = choose(args.what, list(CALLS), "call")
    for backend in backends:
        for what in calls:
            samples = [rate(backend, what, args.n) for _ in range(args.repeats)]
            shown = " ".join(f"{x:,.0f}" for x in samples)
            print(f"{backend:10s} {what:12s} {statistics.median(samples):9,.0f}/s ({shown})")


if __name__ == "__main__":
    main()
