"""A worker process for ``test_shared_limits_multiprocess.py``: one `Gate` over a broker URL.

The test starts children with multiprocessing's ``spawn`` context (`serve` is the target).
Each child runs a Gate serving type ``t`` on queue ``q`` under the limits it is given, with a
handler that holds its slot for ``hold`` seconds (a gateway call), until the store counts
``total`` finished tasks (submitted by the test once every child's gate runs) -- or, with
``total=0``, until it is killed. A task named by ``throttle`` raises a queue-wide `Throttled`
on its first run (recorded as ``throttle``, just before it raises). Every handler start and
end goes to a shared ledger file, one line each, appended with ``O_APPEND`` (atomic for lines
this short) and stamped with ``time.monotonic_ns()``: one clock for every process of the host.
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import anyio

from taskgate import Config, Filter, Gate, QueueConfig, Task, TaskFailedError, Throttled
from taskgate.brokers import open_broker

__all__ = ["Ledger", "WorkerSpec", "serve"]

QUEUE, TYPE = "q", "t"
POLL = 0.02  # idle processes look for free slots and due tasks often
CHILD_DEADLINE = 90.0  # a child still short of ``total`` by then is hung, not slow


@dataclass(frozen=True)
class WorkerSpec:
    """What one child runs: where, under which limits, for how long."""

    url: str
    ledger: str
    queue: dict[str, Any]  # QueueConfig keyword arguments
    hold: float = 0.03
    total: int = 0  # stop once this many tasks of type ``t`` are final; 0 = run until killed
    broker_options: dict[str, Any] = field(default_factory=dict)
    throttle: str = ""  # the id of a task whose first run throttles the whole queue
    retry_after: float = 1.0  # that throttle's, in seconds


@dataclass(frozen=True)
class Entry:
    """One ledger line: which process, what (start, end, throttle: monotonic ns; claimed: the
    store's claim time, ns since the epoch), which task, when."""

    pid: int
    event: str
    task_id: str
    at: int


class Ledger:
    """The shared file of handler starts and ends."""

    def __init__(self, path: str) -> None:
        self.path = path

    def record(self, event: str, task_id: str, at: int | None = None) -> None:
        """Append one line (one ``write`` on an ``O_APPEND`` descriptor: never interleaved),
        at ``at`` (default: now, monotonic ns)."""
        line = f"{os.getpid()} {event} {task_id} {time.monotonic_ns() if at is None else at}\n".encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def entries(self) -> list[Entry]:
        """Every line so far, in file order."""
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="ascii") as f:
            return [
                Entry(int(p), e, t, int(a)) for p, e, t, a in (line.split() for line in f if line.strip())
            ]

    def runs(self) -> list[tuple[int, int, str, int]]:
        """Each finished handler run as ``(start, end, task id, pid)``."""
        started: dict[tuple[int, str], int] = {}
        runs = []
        for entry in self.entries():
            key = (entry.pid, entry.task_id)
            if entry.event == "start":
                started[key] = entry.at
            elif entry.event == "end" and key in started:
                runs.append((started.pop(key), entry.at, entry.task_id, entry.pid))
        return runs

    def starts(self) -> list[int]:
        """Every handler start's time, sorted."""
        return sorted(e.at for e in self.entries() if e.event == "start")

    def claims(self) -> list[int]:
        """When the store leased each run's task (its ``started_at``: what the shared rate
        meters, free of the delay before a loaded process records its start), sorted."""
        return sorted(e.at for e in self.entries() if e.event == "claimed")


def serve(spec: WorkerSpec, ready: Any, go: Any) -> None:
    """Child process entry: run the gate until ``spec.total`` tasks are final (or killed)."""
    anyio.run(_serve, spec, ready, go)


async def _serve(spec: WorkerSpec, ready: Any, go: Any) -> None:
    broker = open_broker(spec.url, **spec.broker_options)
    ledger = Ledger(spec.ledger)
    config = Config(broker=broker, queues={QUEUE: QueueConfig(**spec.queue)}, routes={TYPE: QUEUE})
    gate = Gate(config, poll_interval=POLL)

    @gate.handler(TYPE)
    async def call_gateway(task: Task) -> None:
        # Recorded after the claim and before the slot goes back: each run's [start, end] lies
        # inside the time its slot was held, so overlapping runs never overstate concurrency.
        ledger.record("start", task.id)
        assert task.started_at is not None
        ledger.record("claimed", task.id, at=round(task.started_at.timestamp() * 1e6) * 1000)
        if task.id == spec.throttle and task.throttled == 0:
            ledger.record("throttle", task.id)
            raise Throttled(retry_after=spec.retry_after, scope="queue")
        await anyio.sleep(spec.hold)
        ledger.record("end", task.id)

    try:
        async with gate:
            # Every process's workers look for work before the test submits any (``ready``),
            # so no process runs the queue alone for want of the others having started.
            await anyio.to_thread.run_sync(ready.wait)
            await anyio.to_thread.run_sync(go.wait)
            with anyio.fail_after(CHILD_DEADLINE):
                if not spec.total:
                    await anyio.sleep_forever()
                # Every task was submitted before ``go``: wait for each to end, in whichever
                # process it runs.
                for task in await gate.list(Filter(type=TYPE)):
                    with suppress(TaskFailedError):
                        await gate.wait(task.id)
    finally:
        broker.close()
