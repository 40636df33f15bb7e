"""Submits without snapshots: `Gate` asks for none (``Submit(snapshots=False)``) when no hook
reads them."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from gate_helpers import GUARD, echo_gate, make_gate, until

from taskgate import QueueConfig, Status, Task
from taskgate.brokers.base import Broker
from taskgate.brokers.params import Claim, Claimed, Submit, Submitted

pytestmark = pytest.mark.anyio


class Recording:
    """A broker wrapper recording, per submit, whether it asked for snapshots ("snapshots") or
    only for the statuses ("quiet").

    It declares no cross-process wake-ups, so the runtime does not listen to the broker's own
    signals: only the runtime's reaction to what a submit answered can wake a scheduler."""

    def __init__(self, inner: Broker) -> None:
        self._inner = inner
        self.capabilities = dataclasses.replace(inner.capabilities, cross_process=False)
        self.kinds: list[str] = []
        self.claimed_nothing = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def claim(self, claim: Claim) -> Claimed:
        claimed = self._inner.claim(claim)
        if not claimed.leases:
            self.claimed_nothing.set()
        return claimed

    def submit(self, submit: Submit) -> Submitted:
        self.kinds.append("snapshots" if submit.snapshots else "quiet")
        return self._inner.submit(submit)


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
    assert broker.kinds == ["snapshots" if hook else "quiet"]
    pending = [t.id for t in seen if t.status is Status.PENDING]
    assert pending == (ids if hook else [])


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
