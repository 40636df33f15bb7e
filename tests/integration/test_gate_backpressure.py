"""Back-pressure at the gate: ``QueueConfig(max_pending, on_full)`` -- on memory and SQLite.

A blocked submit is held by the store's count, not by time: the tests let it wait (the event
loop otherwise idle) and check that nothing was stored, then make room by a claim.
"""

from __future__ import annotations

import anyio
import pytest
from gate_helpers import GUARD, make_gate

from taskgate import Gate, QueueConfig, QueueFullError, ShutdownError, Status, SyncClient, Task
from taskgate.brokers.base import Broker

pytestmark = pytest.mark.anyio

LIMIT = 2


def _gate(broker: Broker, on_full: str) -> Gate:
    return make_gate(broker, {"q": QueueConfig(workers=1, max_pending=LIMIT, on_full=on_full)})


async def _waiting(gate: Gate) -> list[Task]:
    return [t for t in await gate.list(queue="q") if t.status in (Status.PENDING, Status.BLOCKED)]


async def _fill(gate: Gate) -> None:
    for n in range(LIMIT):
        await gate.submit("q", {"n": n})


async def _blocked_submit(
    gate: Gate, payload: object, stored: list[str], group: anyio.abc.TaskGroup
) -> anyio.Event:
    """Start a submit of ``payload`` in ``group`` that appends its id to ``stored`` once it is in
    (and sets the event answered), and let it find the queue full and wait."""
    done = anyio.Event()

    async def submit() -> None:
        stored.append(await gate.submit("q", payload))
        done.set()

    group.start_soon(submit)
    for _ in range(20):  # several failed tries, each one a full broker call
        await anyio.wait_all_tasks_blocked()
        await anyio.sleep(0.01)
    assert stored == [], "a submit to a full queue must wait"
    return done


async def test_raise_mode_refuses_a_submit_to_a_full_queue_at_once(gate_broker: Broker) -> None:
    gate = _gate(gate_broker, "raise")
    await _fill(gate)
    with anyio.fail_after(GUARD), pytest.raises(QueueFullError) as raised:
        await gate.submit("q", "one too many")
    assert (raised.value.queue, raised.value.max_pending, raised.value.waiting) == ("q", LIMIT, LIMIT)
    assert len(await _waiting(gate)) == LIMIT
    stats = await gate.stats("q")
    assert (stats.max_pending, stats.queue_len) == (LIMIT, LIMIT)


async def test_a_blocked_submit_waits_and_goes_in_once_a_claim_makes_room(gate_broker: Broker) -> None:
    gate = _gate(gate_broker, "block")
    release = anyio.Event()

    @gate.handler("q")
    async def hold(task: Task) -> None:
        await release.wait()

    await _fill(gate)
    stored: list[str] = []
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as group:
            done = await _blocked_submit(gate, "third", stored, group)
            assert len(await _waiting(gate)) == LIMIT
            async with gate:  # one worker claims one task: room for one
                await done.wait()
                release.set()
    (third,) = stored
    assert (await gate.get(third)).payload == b'"third"'


async def test_the_callers_cancel_scope_ends_a_blocked_submit_with_nothing_stored(
    gate_broker: Broker,
) -> None:
    gate = _gate(gate_broker, "block")
    await _fill(gate)
    with anyio.move_on_after(0.3) as scope:
        await gate.submit("q", "never")
    assert scope.cancelled_caught
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.2):
            await gate.submit("q", "never either")
    assert len(await gate.list(queue="q")) == LIMIT


async def test_a_batch_larger_than_max_pending_raises_at_once_even_when_blocking(gate_broker: Broker) -> None:
    gate = _gate(gate_broker, "block")
    with anyio.fail_after(GUARD), pytest.raises(QueueFullError) as raised:
        await gate.submit_many("q", range(LIMIT + 1))
    assert (raised.value.waiting, raised.value.adding) == (0, LIMIT + 1)
    assert await gate.list(queue="q") == []
    assert len(await gate.submit_many("q", range(LIMIT))) == LIMIT  # a batch that fits goes in


async def test_a_blocked_submit_ends_with_shutdown_error_when_the_gate_shuts_down(
    gate_broker: Broker,
) -> None:
    gate = _gate(gate_broker, "block")
    await _fill(gate)
    outcome: list[BaseException] = []

    async def submit() -> None:
        try:
            await gate.submit("q", "late")
        except ShutdownError as exc:
            outcome.append(exc)

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as group:
            group.start_soon(submit)
            await anyio.wait_all_tasks_blocked()
            await gate.shutdown()
    assert len(outcome) == 1
    assert len(await gate.list(queue="q")) == LIMIT


async def test_other_queues_are_not_held_back(gate_broker: Broker) -> None:
    gate = make_gate(
        gate_broker,
        {"q": QueueConfig(workers=1, max_pending=1, on_full="raise"), "free": QueueConfig(workers=1)},
    )
    await gate.submit("q")
    for _ in range(3):
        await gate.submit("free")
    assert len(await gate.list(queue="free")) == 3


def test_the_sync_client_blocks_until_room_and_raises_like_the_gate(gate_broker: Broker) -> None:
    raising = make_gate(gate_broker, {"q": QueueConfig(workers=1, max_pending=1, on_full="raise")})
    with SyncClient(raising.config) as client:
        client.submit("q", 1)
        with pytest.raises(QueueFullError):
            client.submit("q", 2)
    blocking = make_gate(gate_broker, {"q": QueueConfig(workers=1, max_pending=1)})
    with SyncClient(blocking.config) as client:
        stored: list[str] = []

        async def drain_one_then_wait() -> None:
            # The worker claims the pending task; the sync submit (another thread, another gate)
            # finds the room by trying again.
            release = anyio.Event()

            @blocking.handler("q")
            async def hold(task: Task) -> None:
                await release.wait()

            done = anyio.Event()

            async def submit_in_a_thread() -> None:
                stored.append(await anyio.to_thread.run_sync(client.submit, "q", 3))
                done.set()

            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as group:
                    group.start_soon(submit_in_a_thread)
                    await anyio.sleep(0.1)
                    assert stored == []
                    async with blocking:
                        await done.wait()
                        release.set()

        anyio.run(drain_one_then_wait)
    assert len(stored) == 1
