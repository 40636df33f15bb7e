"""The application `taskgate worker` runs in `test_cli`: ``cli_app:make_gate`` builds its gate on
the store named by ``TASKGATE_URL`` (and ``TASKGATE_PREFIX``), as a deployed app would.

Handlers: ``ok`` stores progress and returns its payload; ``boom`` always raises (a failed task
with a traceback); ``hold`` creates the file ``payload["started"]`` and then runs until cancelled, so a test
can stop the worker while it runs.
"""

from __future__ import annotations

import os
from typing import Any

import anyio

import taskgate
from taskgate import Config, Gate, QueueConfig, Task
from taskgate.brokers import open_broker

QUEUE = "work"
TYPES = ("ok", "boom", "hold")


def open_store(url: str, prefix: str | None) -> Any:
    """The broker of ``url``; ``prefix`` is its table or key prefix."""
    if prefix is None:
        return open_broker(url)
    key = "key_prefix" if url.startswith("redis") else "table_prefix"
    return open_broker(url, **{key: prefix})


async def ok(task: Task) -> Any:
    await taskgate.set_progress({"step": "done"})
    return task.json()


async def boom(task: Task) -> None:
    raise RuntimeError(f"boom: {task.json()}")


async def hold(task: Task) -> None:
    await anyio.Path(task.json()["started"]).touch()
    await anyio.sleep_forever()  # until the worker's shutdown grace runs out


def make_gate(url: str | None = None, prefix: str | None = None) -> Gate:
    """The app's gate: queue ``work`` (2 workers) running the three handlers."""
    broker = open_store(url or os.environ["TASKGATE_URL"], prefix or os.environ.get("TASKGATE_PREFIX"))
    gate = Gate(
        Config(broker=broker, queues={QUEUE: QueueConfig(workers=2)}, routes=dict.fromkeys(TYPES, QUEUE)),
        poll_interval=0.05,
    )
    gate.handle("ok", ok)
    gate.handle("boom", boom)
    gate.handle("hold", hold)
    return gate
