"""``on_state_change`` sees what brokers settle on their own: children woken, descendants canceled.

Every test runs on all five backends: a hook recording (id, status) must see a child go from
blocked to pending when its parent completes, and each descendant of a parent that failed,
was canceled or was failed by the reaper become canceled.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from gate_helpers import GUARD, make_gate

from taskgate import ConfigError, Gate, ManualClock, QueueConfig, SkipRetry, Status, Task, TaskFailedError
from taskgate.brokers.base import Broker, Capabilities

pytestmark = pytest.mark.anyio

QUEUES = {"hold": QueueConfig(workers=1), "q": QueueConfig(workers=2)}
BLOCKED_THEN_CANCELED = [Status.BLOCKED, Status.CANCELED]
WOKEN_AND_RUN = [Status.BLOCKED, Status.PENDING, Status.RUNNING, Status.COMPLETED]


def assert_woken_and_run(statuses: list[Status]) -> None:
    """Each step reported exactly once. Their order is not asserted: each call's snapshots are
    handed to the hook when its caller resumes, so snapshots of concurrent calls can arrive out
    of order (seen on Trio and Redis: a parent's ``completed``, and with it its child's
    ``pending``, after the child's own ``completed``)."""
    assert sorted(statuses, key=WOKEN_AND_RUN.index) == WOKEN_AND_RUN


class Seen:
    """An ``on_state_change`` hook recording each task's statuses in the order reported."""

    def __init__(self) -> None:
        self.reported: list[tuple[str, Status]] = []

    def __call__(self, task: Task) -> None:
        self.reported.append((task.id, task.status))

    def of(self, task_id: str) -> list[Status]:
        return [status for seen_id, status in self.reported if seen_id == task_id]


def _held_parent_gate(broker: Broker, seen: Seen, *, fails: bool) -> tuple[Gate, anyio.Event]:
    """A gate whose "hold" tasks run until the event is set, then complete (or fail for good)."""
    gate = make_gate(broker, QUEUES, on_state_change=seen)
    release = anyio.Event()

    @gate.handler("hold")
    async def hold(task: Task) -> None:
        await release.wait()
        if fails:
            raise SkipRetry("the parent failed for good")

    gate.handle("q", lambda task: None)
    return gate, release


async def _failed(gate: Gate, task_id: str) -> Task:
    with pytest.raises(TaskFailedError) as failed:
        await gate.wait(task_id, timeout=GUARD)
    return failed.value.task


async def test_a_child_woken_by_its_parents_completion_is_reported_pending(broker: Broker) -> None:
    seen = Seen()
    gate, release = _held_parent_gate(broker, seen, fails=False)
    async with gate:
        parent = await gate.submit("hold")
        child = await gate.submit("q", depends_on=[parent])
        release.set()
        await gate.wait(child, timeout=GUARD)
    assert_woken_and_run(seen.of(child))


async def test_descendants_of_a_parent_that_failed_for_good_are_reported_canceled(broker: Broker) -> None:
    seen = Seen()
    gate, release = _held_parent_gate(broker, seen, fails=True)
    async with gate:
        parent = await gate.submit("hold")
        child = await gate.submit("q", depends_on=[parent])
        grandchild = await gate.submit("q", depends_on=[child])
        release.set()
        assert (await _failed(gate, grandchild)).status is Status.CANCELED
    assert seen.of(parent)[-1] is Status.FAILED
    assert (seen.of(child), seen.of(grandchild)) == (BLOCKED_THEN_CANCELED, BLOCKED_THEN_CANCELED)


async def test_a_child_ignoring_its_failed_parent_is_reported_pending(broker: Broker) -> None:
    seen = Seen()
    gate, release = _held_parent_gate(broker, seen, fails=True)
    async with gate:
        parent = await gate.submit("hold")
        child = await gate.submit("q", depends_on=[parent], ignore_parent_failure=True)
        release.set()
        await gate.wait(child, timeout=GUARD)
    assert_woken_and_run(seen.of(child))


async def test_descendants_of_a_canceled_task_are_reported_canceled(broker: Broker) -> None:
    seen = Seen()
    gate = make_gate(broker, QUEUES, on_state_change=seen)
    gate.handle("q", lambda task: None)
    async with gate:
        parent = await gate.submit("q", delay="1h")  # the clock stands still: it stays pending
        child = await gate.submit("q", depends_on=[parent])
        grandchild = await gate.submit("q", depends_on=[child])
        await gate.cancel(parent)
    assert seen.of(parent) == [Status.PENDING, Status.CANCELED]
    assert (seen.of(child), seen.of(grandchild)) == (BLOCKED_THEN_CANCELED, BLOCKED_THEN_CANCELED)


async def test_descendants_of_a_task_the_reaper_failed_are_reported_canceled(
    broker: Broker, clock: ManualClock
) -> None:
    seen = Seen()
    queues = {"hold": QueueConfig(workers=1, manual_heartbeat=True), "q": QueueConfig(workers=1)}
    gate = make_gate(broker, queues, on_state_change=seen, lease_lost_max=1, reap_interval=0.02)
    started = anyio.Event()

    @gate.handler("hold")
    async def hangs(task: Task) -> None:
        started.set()
        await anyio.sleep_forever()  # no heartbeat: the lease runs out, the reaper takes it

    gate.handle("q", lambda task: None)
    async with gate:
        parent = await gate.submit("hold")
        child = await gate.submit("q", depends_on=[parent])
        grandchild = await gate.submit("q", depends_on=[child])
        with anyio.fail_after(GUARD):
            await started.wait()
        clock.advance(timedelta(minutes=2))
        assert (await _failed(gate, grandchild)).status is Status.CANCELED
    assert seen.of(parent)[-1] is Status.FAILED
    assert (seen.of(child), seen.of(grandchild)) == (BLOCKED_THEN_CANCELED, BLOCKED_THEN_CANCELED)


async def test_a_hook_over_a_broker_that_cannot_report_what_it_settles_is_refused() -> None:
    class Reticent:
        """A broker of an older protocol: no `report_settled`."""

        capabilities = Capabilities()

    with pytest.raises(ConfigError, match="report_settled"):
        make_gate(Reticent(), on_state_change=Seen())  # type: ignore[arg-type]
    make_gate(Reticent())  # type: ignore[arg-type]  # without a hook nothing needs it
