"""Where one worker cycle waits: timestamps of claims, ack writes and handler starts.

``python -m benchmarks.cycletrace --backend redis -n 3000 --show 60`` runs ``n`` no-op tasks
through a gate with ``workers=10`` and prints ``--show`` events from the middle of the run, in
ms from the first one shown::

    0.000 ms  run
    ...
    0.736 ms  claim>  10      # the scheduler asks for 10 tasks
    0.796 ms  ack>    10      # the ack writer starts writing 10 acks
    1.767 ms  ack<    10
    2.294 ms  claim<  10      # ... and got 10

The gap between the last ``run`` of a batch and the next ``claim>`` is what the scheduler did
in between; ``claim>``/``claim<`` overlapping ``ack>``/``ack<`` shows the two writes sharing
the store. The wrappers cost a few µs per event, so absolute rates are not the benchmark's.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from benchmarks.cli import ALIASES
from benchmarks.common import QUEUE, Countdown, enqueue_noops, make_gate
from benchmarks.stores import isolated_store
from taskgate.runtime.acks import AckWriter
from taskgate.runtime.scheduler import QueueScheduler
from taskgate.task import Task

__all__ = ["main"]

Event = tuple[float, str, int]


def _traced(events: list[Event], before: str, after: str, size: Callable[..., int], fn: Any) -> Any:
    """``fn`` (an async method) recording ``before`` and ``after`` events around each call."""

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        events.append((time.perf_counter(), before, size(*args, **kwargs)))
        result = await fn(*args, **kwargs)
        events.append((time.perf_counter(), after, len(result or [])))
        return result

    return wrapper


def trace(backend: str, n: int) -> list[Event]:
    """Run ``n`` no-op tasks with ``workers=10`` on ``backend``; the events, in order."""
    events: list[Event] = []
    claim, write = QueueScheduler._claim, AckWriter._write
    QueueScheduler._claim = _traced(events, "claim>", "claim<", lambda _self, k, *_: k, claim)  # type: ignore[method-assign]
    AckWriter._write = _traced(events, "ack>", "ack<", lambda _self, batch: len(batch), write)  # type: ignore[method-assign]
    try:
        with isolated_store(backend) as store:
            broker = store.open()
            enqueue_noops(broker, n)
            gate = make_gate(broker, workers=10)
            countdown = Countdown(n)

            async def handler(task: Task) -> None:
                events.append((time.perf_counter(), "run", 0))
                await countdown(task)

            gate.handle(QUEUE, handler)

            async def run() -> None:
                async with gate:
                    await countdown.done.wait()

            anyio.run(run)
    finally:
        QueueScheduler._claim, AckWriter._write = claim, write  # type: ignore[method-assign]
    return events


def main(argv: Sequence[str] | None = None) -> None:
    """Trace one run and print a window of events from its middle."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.cycletrace")
    p.add_argument("--backend", required=True)
    p.add_argument("-n", type=int, default=3000)
    p.add_argument("--show", type=int, default=60, help="events to print")
    args = p.parse_args(argv)
    events = trace(ALIASES.get(args.backend, args.backend), args.n)
    window = events[len(events) // 2 :][: args.show]
    start = window[0][0]
    for at, what, count in window:
        print(f"{(at - start) * 1e3:9.3f} ms  {what:<7}{count if what != 'run' else ''}")


if __name__ == "__main__":
    main()
