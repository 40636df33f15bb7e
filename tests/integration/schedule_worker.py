"""A worker process for ``test_schedules_multiprocess.py``: one `Gate` ticking a schedule.

The test starts children with multiprocessing's ``spawn`` context (`serve` is the target). Each
runs a gate whose only schedule submits a task every second, and records in a shared ledger
(`limits_worker.Ledger`) each tick it handled: ``created`` when its own submit made the tick's
task (its ``on_state_change`` hook sees the new task), ``existed`` when the submit found the
tick's task made by another process (the ticker's debug line). Once every child's gate runs
(``ready``), each goes on for ``seconds`` and shuts down.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio
from limits_worker import Ledger

from taskgate import Config, Gate, QueueConfig, Schedule, Status, Task
from taskgate.brokers import open_broker
from taskgate.schedules import tick_key

__all__ = ["NAME", "ScheduleSpec", "serve"]

NAME, TYPE = "every-second", "tick"


@dataclass(frozen=True)
class ScheduleSpec:
    """Where one child ticks, where it records, for how long once all children run."""

    url: str
    ledger: str
    seconds: float = 3.0
    broker_options: dict[str, Any] = field(default_factory=dict)


class _Existed(logging.Handler):
    """Records the ticks whose task another process made (the ticker logs each at DEBUG)."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(logging.DEBUG)
        self.ledger = ledger

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.endswith("submitted by another gate"):
            name, tick = record.args  # type: ignore[misc]
            self.ledger.record("existed", tick_key(name, datetime.fromisoformat(tick)))


def serve(spec: ScheduleSpec, ready: Any) -> None:
    """Child process entry: tick the schedule until ``spec.seconds`` after every child runs."""
    anyio.run(_serve, spec, ready)


async def _serve(spec: ScheduleSpec, ready: Any) -> None:
    broker = open_broker(spec.url, **spec.broker_options)
    ledger = Ledger(spec.ledger)

    def created(task: Task) -> None:
        if task.status is Status.PENDING and task.business_key:
            ledger.record("created", task.business_key)

    logger = logging.getLogger("taskgate")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(_Existed(ledger))
    config = Config(
        broker=broker,
        queues={"q": QueueConfig(workers=1)},
        routes={TYPE: "q"},
        on_state_change=created,
        schedules=[Schedule(NAME, "* * * * * *", TYPE, catch_up=True)],
    )
    try:
        async with Gate(config, poll_interval=0.02):
            await anyio.to_thread.run_sync(ready.wait)
            await anyio.sleep(spec.seconds)
    finally:
        broker.close()
