"""Bulk and pipeline recovery through `Gate` on all five backends: `replay(descendants=True)`,
`replay_many`, `cancel_many`.

A three-stage pipeline (extract -> transform -> load) whose first stage fails against a
gateway that is down has its later stages canceled; once the gateway is back, one call re-runs
the failed stage and the canceled ones, in order.
"""

from __future__ import annotations

import pytest
from gate_helpers import eventually, make_gate

from taskgate import QueueConfig, Status, Task
from taskgate.brokers.base import Broker
from taskgate.gate import Gate
from taskgate.task import Filter

pytestmark = pytest.mark.anyio

STAGES = ("extract", "transform", "load")


class Gateway:
    """Down until `up`; records the stages that ran, in order."""

    def __init__(self) -> None:
        self.up = False
        self.ran: list[str] = []

    async def call(self, task: Task) -> str:
        if not self.up:
            raise ConnectionError("gateway down")
        self.ran.append(task.type)
        return task.type


def pipeline_gate(broker: Broker, gateway: Gateway) -> Gate:
    gate = make_gate(
        broker,
        {"q": QueueConfig(workers=2), "idle": QueueConfig(workers=1)},
        routes=dict.fromkeys(STAGES, "q"),
    )
    for stage in STAGES:
        gate.handle(stage, gateway.call)
    return gate


async def failed_pipeline(gate: Gate) -> list[str]:
    """A pipeline whose extract failed for good, its later stages canceled: their ids."""
    extract = await gate.submit("extract", max_retry=0)
    transform = await gate.submit("transform", depends_on=[extract])
    load = await gate.submit("load", depends_on=[transform])
    await eventually(gate, load, lambda t: t.status is Status.CANCELED)
    assert (await gate.get(extract)).status is Status.FAILED
    return [extract, transform, load]


async def test_replay_with_descendants_recovers_a_failed_pipeline_in_one_call(broker: Broker) -> None:
    gateway = Gateway()
    gate = pipeline_gate(broker, gateway)
    async with gate:
        old = await failed_pipeline(gate)
        gateway.up = True
        new_extract = await gate.replay(old[0], descendants=True)
        (load,) = [t for t in await gate.list(type="load") if t.replay_of == old[2]]
        done = await eventually(gate, load.id, lambda t: t.status is Status.COMPLETED)
    assert gateway.ran == list(STAGES)  # each stage waited for the new one before it
    transform = await gate.get(done.depends_on[0])
    assert (transform.replay_of, transform.depends_on, done.replay_of) == (old[1], (new_extract,), old[2])
    assert [(await gate.get(task_id)).status for task_id in old] == [
        Status.FAILED,
        Status.CANCELED,
        Status.CANCELED,
    ]


async def test_replay_many_recovers_every_failed_pipeline_once(broker: Broker) -> None:
    gateway = Gateway()
    gate = pipeline_gate(broker, gateway)
    async with gate:
        pipelines = [await failed_pipeline(gate) for _ in range(2)]
        gateway.up = True
        made = await gate.replay_many(Filter(status=Status.FAILED))
        assert len(made) == 6  # two extracts, each with its transform and load
        for task_id in made:
            await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED)
        assert await gate.replay_many(Filter(status=Status.FAILED)) == []  # each was re-run already
        assert await gate.replay_many() == []  # nor are the canceled stages re-run on their own
        with pytest.raises(ValueError, match="final tasks only"):
            await gate.replay_many(status=Status.PENDING)
    replayed = {(await gate.get(task_id)).replay_of for task_id in made}
    assert replayed == {task_id for pipeline in pipelines for task_id in pipeline}


async def test_cancel_many_cancels_what_the_filter_matches_and_nothing_else(broker: Broker) -> None:
    gate = make_gate(broker, {"q": QueueConfig(workers=1), "idle": QueueConfig(workers=1)})
    waiting = [await gate.submit("idle", n) for n in range(4)]  # no handler: they stay pending
    child = await gate.submit("idle", depends_on=[waiting[0]])
    other = await gate.submit("q", "elsewhere")
    tenant = await gate.submit("idle", group="tenant-b")
    assert await gate.cancel_many(queue="idle", group="tenant-b") == 1
    assert (await gate.get(tenant)).status is Status.CANCELED
    canceled = await gate.cancel_many(Filter(queue="idle"))
    assert canceled in (4, 5)  # the child either went with its parent or on its own
    assert {(await gate.get(t)).status for t in [*waiting, child]} == {Status.CANCELED}
    assert (await gate.get(other)).status is Status.PENDING
    assert await gate.cancel_many(queue="idle") == 0  # nothing left to cancel
    assert await gate.cancel_many(status=Status.COMPLETED) == 0
