"""Child processes of the benchmarks: ``python -m benchmarks.child <mode> <json>``.

- ``process``: run a gate on the store with ``workers`` no-op workers; print ``ready``, start
  on a ``go`` line from stdin, stop at the next line (or EOF) and print how many ran here.
- ``latency``: run a gate whose handler prints ``<task id> <time.monotonic()>`` as it starts
  (CLOCK_MONOTONIC is shared by every process of the host, so the parent can subtract).
- ``rss``: hold ``tasks`` pending no-op tasks in a memory broker; print the RSS before/after.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from typing import Any

import anyio

from benchmarks.common import QUEUE, make_gate
from benchmarks.stores import open_spec
from taskgate import Task
from taskgate.brokers.base import NewTask
from taskgate.brokers.params import Submit
from taskgate.ids import new_id
from taskgate.testing import steps

__all__ = ["main"]


def _line() -> str:
    return sys.stdin.readline().strip()


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def _process(options: dict[str, Any]) -> None:
    broker = open_spec(options["spec"])
    gate = make_gate(broker, workers=options["workers"])
    ran = 0

    async def noop(task: Task) -> None:
        nonlocal ran
        ran += 1

    gate.handle(QUEUE, noop)
    _say("ready")
    await anyio.to_thread.run_sync(_line)
    async with gate:
        await anyio.to_thread.run_sync(_line)
    broker.close()
    _say(str(ran))


async def _latency(options: dict[str, Any]) -> None:
    broker = open_spec(options["spec"])
    gate = make_gate(broker, workers=options.get("workers", 10))

    async def started(task: Task) -> None:
        _say(f"{task.id} {time.monotonic()!r}")

    gate.handle(QUEUE, started)
    async with gate:
        _say("ready")
        await anyio.to_thread.run_sync(_line)
    broker.close()


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _rss(options: dict[str, Any]) -> None:
    from taskgate.brokers.memory import MemoryBroker

    broker = MemoryBroker()
    broker.submit(Submit((NewTask(id=new_id(), type=QUEUE, queue=QUEUE),)))  # warm the code paths
    gc.collect()
    before = _rss_bytes()
    started = time.perf_counter()
    left = options["tasks"] - 1
    while left > 0:
        count = min(10_000, left)
        broker.submit(Submit(tuple(NewTask(id=new_id(), type=QUEUE, queue=QUEUE) for _ in range(count))))
        left -= count
    seconds = time.perf_counter() - started
    gc.collect()
    assert steps.queue_length(broker, QUEUE) == options["tasks"]
    _say(json.dumps({"before": before, "after": _rss_bytes(), "seconds": seconds}))


def main(argv: list[str]) -> None:
    """Run the mode ``argv[0]`` with the JSON options ``argv[1]``."""
    mode, options = argv[0], json.loads(argv[1])
    if mode == "process":
        anyio.run(_process, options)
    elif mode == "latency":
        anyio.run(_latency, options)
    elif mode == "rss":
        _rss(options)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
