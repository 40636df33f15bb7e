"""A worker process for ``test_rolling_deploy.py``: one `Gate` handling the types it is given.

The test starts an "old" process (without the handler of a type the deploy brings) and a
"new" one (with it) over one store, with multiprocessing's ``spawn`` context (`serve` is the
target). Each runs its gate until every task the test submitted (once both gates run) is
final, and raises -- ending with a non-zero exit code -- if one of them failed. Every handler
start goes to a shared ledger (`limits_worker.Ledger`) with the process's pid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
from limits_worker import Ledger

from taskgate import Config, Filter, Gate, QueueConfig, Task
from taskgate.brokers import open_broker

__all__ = ["QUEUE", "RollingSpec", "serve"]

QUEUE = "q"
POLL = 0.02  # the old process looks for due tasks often: it would find the new type's at once
CHILD_DEADLINE = 90.0  # a child still waiting by then is hung, not slow


@dataclass(frozen=True)
class RollingSpec:
    """What one child runs: where, which types it has handlers for, how long a run holds."""

    url: str
    ledger: str
    handles: tuple[str, ...]
    hold: float = 0.02
    broker_options: dict[str, Any] = field(default_factory=dict)


def serve(spec: RollingSpec, ready: Any, go: Any) -> None:
    """Child process entry: run the gate until every submitted task is final."""
    anyio.run(_serve, spec, ready, go)


async def _serve(spec: RollingSpec, ready: Any, go: Any) -> None:
    broker = open_broker(spec.url, **spec.broker_options)
    ledger = Ledger(spec.ledger)
    routes = {"old": QUEUE, "new": QUEUE}
    config = Config(broker=broker, queues={QUEUE: QueueConfig(workers=2)}, routes=routes)
    gate = Gate(config, poll_interval=POLL)

    async def run(task: Task) -> None:
        ledger.record("start", task.id)
        await anyio.sleep(spec.hold)  # the new type's tasks stay due a while: the old process polls meanwhile

    for task_type in spec.handles:
        gate.handle(task_type, run)
    try:
        async with gate:
            await anyio.to_thread.run_sync(ready.wait)  # both gates claim before the test submits
            await anyio.to_thread.run_sync(go.wait)
            with anyio.fail_after(CHILD_DEADLINE):
                for task in await gate.list(Filter(queue=QUEUE)):
                    await gate.wait(task.id)  # TaskFailedError: a task failed, the child fails
    finally:
        broker.close()
