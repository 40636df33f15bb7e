"""A worker process: one `Gate` serving every queue of the workload until SIGTERM (or SIGKILL).

Usage: ``python -m torture.worker SPEC_JSON`` with ``tests/`` on ``PYTHONPATH``; the spec
names the store (``url``, broker ``options``), the ``ledger`` file, the process ``name`` and
``inject_bug``. Handlers record ``start`` (with the claim number, ``task.claims``, and the
store's ``started_at``) and ``end`` (with the outcome: ok, error, throttled or cancelled)
around their work.

``inject_bug="ignore-lease-loss"`` is the checker's own test, never the library's: the handler
shields its work from cancellation, so a run whose lease was lost keeps going while another
process runs the task again -- the overlap the checker must report.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

import anyio

from taskgate import Gate, Task, Throttled
from taskgate.brokers import open_broker

from .ledger import Ledger
from .workload import QUEUES, config

POLL = 0.1
SHUTDOWN_TIMEOUT = 10.0


def _handler(ledger: Ledger, inject_bug: str) -> Any:
    async def run(task: Task) -> dict[str, Any]:
        p = task.json()
        started = task.started_at.timestamp() if task.started_at is not None else None
        ledger.record(
            "start",
            id=task.id,
            q=task.queue,
            g=task.group,
            claim=task.claims,
            started_at=started,
            hold=p["hold"],
        )
        outcome = "cancelled"
        try:
            if task.throttled < p["throttle"]:
                outcome = "throttled"
                raise Throttled(retry_after=0.3, scope=p["scope"])
            if inject_bug == "ignore-lease-loss":
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(p["hold"])
            else:
                await anyio.sleep(p["hold"])
            if task.attempts < p["fail"]:
                outcome = "error"
                raise RuntimeError(f"planned failure {task.attempts + 1} of {p['fail']}")
            outcome = "ok"
            return {"k": p["k"]}
        finally:
            ledger.record("end", id=task.id, q=task.queue, g=task.group, claim=task.claims, out=outcome)

    return run


async def _serve(spec: dict[str, Any]) -> None:
    ledger = Ledger(spec["ledger"], spec["name"])
    broker = open_broker(spec["url"], **spec.get("options", {}))
    gate = Gate(config(broker), poll_interval=POLL)
    handler = _handler(ledger, spec.get("inject_bug", ""))
    for name in QUEUES:
        gate.handle(name, handler)
    ledger.record("boot")
    try:
        async with anyio.create_task_group() as group:
            await group.start(gate.run)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    break
            await gate.shutdown(SHUTDOWN_TIMEOUT)
    finally:
        ledger.record("exit")
        broker.close()


def main(argv: list[str]) -> None:
    """Run a worker described by ``argv[0]`` (JSON)."""
    anyio.run(_serve, json.loads(argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
