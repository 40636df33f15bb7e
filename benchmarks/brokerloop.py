"""The broker alone, no runtime: ``claim(k=10)`` then one ``settle`` completing those 10, in one thread.

``python -m benchmarks.brokerloop --backend pg -n 3000`` prints tasks/s and the mean time of a
claim and of a ``settle``. With ``--statements``, on SQL, also the mean time of each kind of
statement (the first words of its text) between SQLAlchemy's before/after cursor events --
where a transition spends its round trips; listening to those events sends the prepared
statements through SQLAlchemy's own execution, so the loop itself runs slower then. The gap
between this and ``process.w10`` is the runtime's.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from benchmarks.cli import ALIASES
from benchmarks.common import QUEUE, enqueue_noops
from benchmarks.stores import isolated_store
from taskgate.brokers.params import Claim, Complete, Settle

__all__ = ["main"]

BATCH = 10
LEASE = timedelta(seconds=60)


class StatementTimes:
    """Mean time per kind of statement, from SQLAlchemy's cursor events on one engine."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import event

        self.total: defaultdict[str, float] = defaultdict(float)
        self.count: defaultdict[str, int] = defaultdict(int)
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, *_: Any) -> None:
        conn.info["taskgate_bench_t0"] = time.perf_counter()

    def _after(self, conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        kind = " ".join(statement.split()[:3])[:48]
        self.total[kind] += time.perf_counter() - conn.info.pop("taskgate_bench_t0")
        self.count[kind] += 1

    def report(self, cycles: int) -> list[str]:
        lines = []
        for kind in sorted(self.total, key=lambda k: -self.total[k]):
            per_cycle, mean_ms = self.count[kind] / cycles, self.total[kind] / self.count[kind] * 1e3
            lines.append(f"    {kind:<50} {per_cycle:5.2f}/cycle x {mean_ms:6.2f} ms")
        return lines


def main(argv: Sequence[str] | None = None) -> None:
    """Run the loop on one backend and print what it measured."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.brokerloop")
    p.add_argument("--backend", required=True)
    p.add_argument("-n", type=int, default=3000)
    p.add_argument(
        "--statements",
        action="store_true",
        help="also time each kind of statement (cursor events: SQLAlchemy's slower execution path)",
    )
    args = p.parse_args(argv)
    backend = ALIASES.get(args.backend, args.backend)
    with isolated_store(backend) as store:
        broker = store.open()
        enqueue_noops(broker, args.n)
        engine = getattr(broker, "_engine", None)
        statements = StatementTimes(engine) if engine is not None and args.statements else None
        claim_s = ack_s = 0.0
        done = cycles = 0
        start = time.perf_counter()
        while done < args.n:
            t0 = time.perf_counter()
            leases = broker.claim(Claim(QUEUE, BATCH, LEASE)).leases
            t1 = time.perf_counter()
            broker.settle(Settle(tuple(Complete(lease.task.id, lease.token) for lease in leases)))
            ack_s += time.perf_counter() - t1
            claim_s += t1 - t0
            done, cycles = done + len(leases), cycles + 1
            if not leases:
                raise RuntimeError("the store ran dry before every task was claimed")
        elapsed = time.perf_counter() - start
    print(
        f"{backend} claim({BATCH}) + settle: {done / elapsed:,.0f} tasks/s; "
        f"claim {claim_s / cycles * 1e3:.2f} ms, settle {ack_s / cycles * 1e3:.2f} ms per call"
    )
    if statements is not None:
        print("\n".join(statements.report(cycles)))


if __name__ == "__main__":
    main()
