"""One task's transitions on the broker alone: ``cancel`` of a pending task, ``claim`` of one
task followed by its ``retry`` (a gateway's "busy" answer).

``python -m benchmarks.transitions [--backend pg,mariadb,sqlite,redis,memory] [-n 300]`` prints
per backend the calls per second of each, on a fresh isolated store, no runtime around them.
Run it from two trees in turn to compare two versions of the code.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from datetime import timedelta

from benchmarks.cli import choose
from benchmarks.stores import BACKENDS, isolated_store
from taskgate.brokers.base import FailureKind, NewTask
from taskgate.brokers.params import Claim, Retry, Settle, Submit
from taskgate.ids import new_id

__all__ = ["main", "rates"]

_LEASE = timedelta(seconds=60)
_WARM_UP = 5


def rates(backend: str, n: int) -> tuple[float, float]:
    """(cancels per second, claim-and-retry cycles per second) on a fresh store."""
    with isolated_store(backend) as store:
        broker = store.open()
        fresh = tuple(NewTask(id=new_id(), type="t", queue="q") for _ in range(n + _WARM_UP))
        tasks = broker.submit(Submit(fresh)).tasks
        for task in tasks[:_WARM_UP]:
            broker.cancel(task.id)
        start = time.perf_counter()
        for task in tasks[_WARM_UP:]:
            broker.cancel(task.id)
        cancels = n / (time.perf_counter() - start)
        broker.submit(Submit((NewTask(id=new_id(), type="t", queue="r"),)))
        start = time.perf_counter()
        for _ in range(n):
            (lease,) = broker.claim(Claim("r", 1, _LEASE)).leases
            broker.settle(Settle((Retry(lease.task.id, lease.token, FailureKind.THROTTLED, "busy"),)))
        return cancels, n / (time.perf_counter() - start)


def main(argv: Sequence[str] | None = None) -> None:
    """Print, per backend, the rates of both."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transitions")
    parser.add_argument("--backend", default="postgresql,mariadb,sqlite,redis,memory")
    parser.add_argument("-n", type=int, default=300, help="calls of each per run")
    args = parser.parse_args(argv)
    for backend in choose(args.backend, BACKENDS, "backend"):
        cancels, retries = rates(backend, args.n)
        print(f"{backend:10s} cancel {cancels:9,.0f}/s  claim+retry {retries:9,.0f}/s")


if __name__ == "__main__":
    main()
