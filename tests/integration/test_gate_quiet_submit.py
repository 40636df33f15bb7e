"""Submits without snapshots: `Gate` stores with `QuietEnqueuer.enqueue_quiet` when no hook reads them."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, cast

import anyio
import pytest
from gate_helpers import GUARD, echo_gate, make_gate, until

from taskgate import QueueConfig, Status, Task
from taskgate.brokers.base import Broker, Lease, NewTask, QuietEnqueuer

pytestmark = pytest.mark.anyio


class Recording:
    """A broker wrapper recording which of ``enqueue`` / ``enqueue_quiet`` stored each batch.

    It declares no cross-process wake-ups, so the runtime does not listen to the broker's own
    signals: only the runtime's reaction to what a submit answered can wake a scheduler."""

    def __init__(self, inner: Broker, *, quiet_enqueue: bool = True) -> None:
        self._inner = inner
        self.capabilities = dataclasses.replace(
            inner.capabilities,
            cross_process=False,
            quiet_enqueue=quiet_enqueue,
            acks_in_claims=False,
        )
        self.kinds: list[str] = []
        self.claimed_nothing = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def claim(self, queue: str, limit: int, lease_ttl: timedelta) -> list[Lease]:
        leases = self._inner.claim(queue, limit, lease_ttl)
        if not leases:
            self.claimed_nothing.set()
        return leases

    def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        self.kinds.append("enqueue")
        return self._inner.enqueue(tasks)

    def enqueue_quiet(self, tasks: Sequence[NewTask]) -> list[Status]:
        assert self.capabilities.quiet_enqueue, "enqueue_quiet called on a broker not declaring it"
        self.kinds.append("enqueue_quiet")
        return cast(QuietEnqueuer, self._inner).enqueue_quiet(tasks)


def _is_set(event: threading.Event) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return event.is_set()

    return check


@pytest.mark.parametrize("hook", [False, True])
async def test_submits_are_quiet_unless_a_hook_reads_the_snapshots(gate_broker, hook):
    broker = Recording(gate_broker)
    seen: list[Task] = []
    # Only the wake-up of the submit itself can start the tasks (the gate's poll is beyond GUARD).
    gate = echo_gate(broker, 2, seen if hook else None)
    async with gate:
        await until(_is_set(broker.claimed_nothing))  # the scheduler found nothing: it sleeps
        ids = await gate.submit_many("q", [None] * 4)
        with anyio.fail_after(GUARD):
            results = [await gate.wait(task_id) for task_id in ids]
    assert results == [f'"{task_id}"'.encode() for task_id in ids]
    assert broker.kinds == ["enqueue" if hook else "enqueue_quiet"]
    pending = [t.id for t in seen if t.status is Status.PENDING]
    assert pending == (ids if hook else [])


async def test_a_broker_without_quiet_enqueue_is_submitted_to_with_snapshots(gate_broker):
    broker = Recording(gate_broker, quiet_enqueue=False)
    gate = make_gate(broker, {"q": QueueConfig(workers=2)}, poll_interval=GUARD * 2)
    gate.handle("q", lambda task: None)
    async with gate:
        ids = await gate.submit_many("q", [None] * 3)
        with anyio.fail_after(GUARD):
            for task_id in ids:
                await gate.wait(task_id)
    assert broker.kinds == ["enqueue"]


async def test_a_quiet_submit_of_a_child_of_a_failed_parent_answers_canceled(gate_broker):
    gate = make_gate(Recording(gate_broker), {"q": QueueConfig(workers=1)})

    @gate.handler("q")
    async def fail(task: Task) -> None:
        raise RuntimeError("parent fails")

    async with gate:
        parent = await gate.submit("q", None, max_retry=0)
        with anyio.fail_after(GUARD), pytest.raises(Exception, match="parent fails"):
            await gate.wait(parent)
        (child,) = await gate.submit_many("q", [None], depends_on=[parent])
        assert (await gate.get(child)).status is Status.CANCELED
