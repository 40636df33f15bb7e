"""Retention and purge through `Gate` on all five backends, time moved on a `ManualClock`.

The reaper of a running gate deletes final tasks past their retention (`Retention`, per queue
overridable); `Gate.purge` deletes final tasks on demand. Neither touches a task still to run
or a parent one is waiting for, and a business key whose executions are all gone is free.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
import redis
from gate_helpers import GUARD, eventually, make_gate, until

from taskgate import ManualClock, QueueConfig, Retention, Status, Task, TaskNotFoundError
from taskgate.brokers.base import Broker
from taskgate.gate import Gate
from taskgate.task import Filter

pytestmark = pytest.mark.anyio

DAY = timedelta(days=1)
QUEUES = {"q": QueueConfig(workers=2, lease_ttl="1h"), "keep": QueueConfig(workers=1, lease_ttl="1h")}


async def gone(gate: Gate, task_id: str) -> bool:
    try:
        await gate.get(task_id)
    except TaskNotFoundError:
        return True
    return False


def retention_gate(broker: Broker, **options: Any) -> Gate:
    """A gate with a fast reaper (every 10 ms), queues "q" and "keep", handlers "q" (answers
    ok) and "slow" (in "keep", waits for the test to let it finish)."""
    return make_gate(broker, QUEUES, reap_interval=0.01, routes={"slow": "keep"}, **options)


async def test_the_reaper_deletes_old_final_tasks_and_keeps_what_is_still_needed(
    broker: Broker, clock: ManualClock
) -> None:
    gate = retention_gate(broker)
    release = anyio.Event()

    @gate.handler("q")
    async def done(task: Task) -> str:
        return "ok"

    @gate.handler("slow")
    async def slow(task: Task) -> str:
        await release.wait()
        return "ok"

    async with gate:
        old = [await gate.submit("q", business_key=f"order-{n}") for n in range(3)]
        parent = await gate.submit("q")
        blocker = await gate.submit("slow")
        child = await gate.submit("q", depends_on=[parent, blocker])
        for task_id in [*old, parent]:
            await gate.wait(task_id, timeout=GUARD)
        clock.advance(8 * DAY)
        young = await gate.submit("q")
        await gate.wait(young, timeout=GUARD)

        await until(lambda: _all_gone(gate, old))
        assert (await gate.get(parent)).status is Status.COMPLETED  # its child is still blocked
        assert (await gate.get(child)).status is Status.BLOCKED
        assert (await gate.get(young)).status is Status.COMPLETED

        again = await gate.submit("q", business_key="order-0")  # the key is free again
        assert [t.id for t in await gate.history("order-0")] == [again]

        release.set()
        await gate.wait(child, timeout=GUARD)
        clock.advance(8 * DAY)
        await until(lambda: _all_gone(gate, [parent, blocker, child, young, again]))
        assert await gate.list(Filter()) == []


async def _all_gone(gate: Gate, ids: list[str]) -> bool:
    return all([await gone(gate, task_id) for task_id in ids])


async def test_a_queue_keeps_its_tasks_as_its_own_retention_says(broker: Broker, clock: ManualClock) -> None:
    queues = {
        "q": QueueConfig(workers=1, lease_ttl="1h", retention=Retention(completed="1h")),
        "keep": QueueConfig(workers=1, lease_ttl="1h", retention=Retention(completed=None)),
    }
    daily = Retention(completed="1d")
    gate = make_gate(broker, queues, reap_interval=0.01, retention=daily, routes={"k": "keep"})

    @gate.handler("q")
    async def short(task: Task) -> None:
        return None

    @gate.handler("k")
    async def kept(task: Task) -> None:
        return None

    async with gate:
        brief, forever = await gate.submit("q"), await gate.submit("k")
        await gate.wait(brief, timeout=GUARD)
        await gate.wait(forever, timeout=GUARD)
        clock.advance(timedelta(hours=2))
        await until(lambda: gone(gate, brief))
        clock.advance(365 * DAY)
        later = await gate.submit("q")  # gone after a pass that also saw `forever` a year old
        await gate.wait(later, timeout=GUARD)
        clock.advance(timedelta(hours=2))
        await until(lambda: gone(gate, later))
    assert (await gate.get(forever)).status is Status.COMPLETED


async def test_purge_deletes_final_tasks_on_demand_and_refuses_statuses_that_are_not(
    broker: Broker, clock: ManualClock
) -> None:
    gate = make_gate(broker, QUEUES, retention=Retention(completed=None, canceled=None, failed=None))

    @gate.handler("q")
    async def done(task: Task) -> None:
        if task.json() == "fail":
            raise ValueError("no")

    async with gate:
        done_ids = [await gate.submit("q") for _ in range(3)]
        failed = await gate.submit("q", "fail")
        for task_id in done_ids:
            await gate.wait(task_id, timeout=GUARD)
        await eventually(gate, failed, lambda t: t.status is Status.FAILED)
        clock.advance(DAY)
        fresh = await gate.submit("q")
        await gate.wait(fresh, timeout=GUARD)
        waiting = await gate.submit("keep")  # no handler for it: it stays pending

        for status in (Status.PENDING, Status.RUNNING, Status.BLOCKED, Status.RETRYING):
            with pytest.raises(ValueError, match=f"final tasks only.*{status.value}"):
                await gate.purge(Filter(status=status))
        with pytest.raises(ValueError, match="older_than"):
            await gate.purge(older_than="-1d")
        assert len(await gate.list(Filter())) == 6  # nothing was deleted

        assert await gate.purge(Filter(status=Status.FAILED)) == 1
        assert await gate.purge(older_than="12h") == 3
        assert [t.id for t in await gate.list(Filter())] == [fresh, waiting]
        assert await gate.purge() == 1
        assert [t.id for t in await gate.list(Filter())] == [waiting]
        assert await gate.overview() == {"keep": {Status.PENDING: 1}}


async def test_purge_takes_many_bounded_calls_and_honours_the_filter_limit(broker: Broker) -> None:
    gate = make_gate(broker, QUEUES, retention=Retention(completed=None))

    @gate.handler("q")
    async def done(task: Task) -> None:
        return None

    async with gate:
        ids = await gate.submit_many("q", [None] * 1203)
        for task_id in ids:
            await gate.wait(task_id, timeout=GUARD)
        assert await gate.purge(Filter(limit=3)) == 3
        assert await gate.purge(Filter(queue="keep")) == 0
        assert await gate.purge(Filter(queue="q", type="q")) == 1200
    assert await gate.list(Filter()) == []


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
async def test_a_purge_leaves_no_redis_key_of_its_tasks_behind(
    broker: Broker, client: redis.Redis, unique_prefix: str
) -> None:
    gate = make_gate(broker, QUEUES, retention=Retention(completed=None, canceled=None, failed=None))

    @gate.handler("q")
    async def done(task: Task) -> None:
        if task.json() == "fail":
            raise ValueError("no")

    async with gate:
        parent = await gate.submit("q", business_key="k1", group="g")
        child = await gate.submit("q", depends_on=[parent], business_key="k2")
        failed = await gate.submit("q", "fail")
        await gate.wait(child, timeout=GUARD)
        await eventually(gate, failed, lambda t: t.status is Status.FAILED)
        again = await gate.replay(failed)
        await eventually(gate, again, lambda t: t.status is Status.FAILED)
        assert await gate.purge() == 4

    base = f"{unique_prefix}{{{unique_prefix.rstrip(':')}}}:"
    left = sorted(k.decode()[len(base) :] for k in client.scan_iter(match=f"{base}*", count=1000))
    assert [k for k in left if k not in ("stats", "types:q")] == []
    assert set(client.hvals(f"{base}stats")) <= {b"0"}
