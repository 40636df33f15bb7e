"""Count what one no-op task costs the store: statements, transactions, Redis requests per task.

``python -m benchmarks.roundtrips --backend pg -n 2000 [--variant rps]`` runs ``submit.single``
and ``process.w10`` (with the limits benchmark's ``--variant``, if given) once each with
counters hooked in (SQLAlchemy engine events for SQL, the
connection's ``send_packed_command`` for Redis) and prints the counts divided by the tasks.
Round trips per task times the round-trip time is the floor under a latency-bound figure.
It also times every broker method (in the thread that runs it): calls per task, mean time per
call, and the share of the run's wall time some broker call was in progress ("busy").
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from benchmarks.cli import ALIASES
from benchmarks.processing import LIMIT_VARIANTS, process_in_process
from benchmarks.settings import Settings
from benchmarks.submit import submit_single

__all__ = ["main"]

COUNTS: Counter[str] = Counter()


def _hook_sql() -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def count(name: str) -> Callable[..., None]:
        def hook(*_args: Any, **_kwargs: Any) -> None:
            COUNTS[name] += 1

        return hook

    event.listen(Engine, "before_cursor_execute", count("statements"))
    event.listen(Engine, "begin", count("transactions"))
    event.listen(Engine, "commit", count("commits"))


def _hook_redis() -> None:
    import redis.connection

    original = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        COUNTS["requests"] += 1
        original(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]


class _BrokerTimer:
    """Wraps a broker class's protocol methods to count and time their calls."""

    # The verbs a run calls (a claim carries its acks, quota and shared limits; a settle its
    # give-back), so each count is of broker calls, whatever rode on them.
    METHODS = ("submit", "claim", "settle", "heartbeat", "reap", "counts", "wait_for_work")

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()
        self.intervals: list[tuple[float, float]] = []

    def install(self, cls: type) -> None:
        for name in self.METHODS:
            original = getattr(cls, name, None)
            if original is not None:
                setattr(cls, name, self._wrap(name, original))

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                t1 = time.perf_counter()
                self.calls[name] += 1
                self.seconds[name] += t1 - t0
                if name not in ("wait_for_work", "counts"):
                    self.intervals.append((t0, t1))

        return timed

    def busy_share(self) -> float:
        """Share of the span from first to last call covered by at least one call in progress."""
        if not self.intervals:
            return 0.0
        spans = sorted(self.intervals)
        covered, (start, end) = 0.0, spans[0]
        for a, b in spans[1:]:
            if a > end:
                covered, start, end = covered + end - start, a, b
            else:
                end = max(end, b)
        covered += end - start
        return covered / (spans[-1][1] - spans[0][0])

    def report(self, n: int) -> str:
        parts = [
            f"{k} {self.calls[k] / n:.2f}x{self.seconds[k] / self.calls[k] * 1000:.2f}ms"
            for k in sorted(self.calls)
            if k not in ("wait_for_work", "counts")
        ]
        return f"broker calls per task (count x mean): {', '.join(parts)}; busy {self.busy_share():.0%}"

    def clear(self) -> None:
        self.calls.clear()
        self.seconds.clear()
        self.intervals.clear()


def _broker_class(backend: str) -> type:
    if backend == "memory":
        from taskgate.brokers.memory import MemoryBroker

        return MemoryBroker
    if backend == "redis":
        from taskgate.brokers.redis import RedisBroker

        return RedisBroker
    from taskgate.brokers.sql import SQLBroker

    return SQLBroker


def main(argv: Sequence[str] | None = None) -> None:
    """Print per-task store operations of submit and processing on one backend."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.roundtrips")
    p.add_argument("--backend", required=True)
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--variant", default="none", choices=sorted(LIMIT_VARIANTS))
    args = p.parse_args(argv)
    backend = ALIASES.get(args.backend, args.backend)
    if backend != "memory":
        (_hook_redis if backend == "redis" else _hook_sql)()
    timer = _BrokerTimer()
    timer.install(_broker_class(backend))
    s = replace(Settings(), n=args.n, repeats=1, run_cap=60.0)
    process = partial(process_in_process, variant=args.variant)
    for name, run in (("submit.single", submit_single), ("process.w10", process)):
        COUNTS.clear()
        timer.clear()
        rate = run(backend, s)
        value = rate[0] if isinstance(rate, list) else rate
        per_task = ", ".join(f"{k} {v / args.n:.2f}" for k, v in sorted(COUNTS.items()))
        print(f"{backend} {name}: {value:,.0f} tasks/s; per task: {per_task}")
        print(f"    {timer.report(args.n)}")


if __name__ == "__main__":
    main()
