"""Group commit of acks: one `settle` per batch of finished handlers, overlapping the next claim."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from gate_helpers import GUARD, echo_gate, eventually, is_ack_batch, make_gate, until

from taskgate import Gate, QueueConfig, Status, Task, TaskExistsError
from taskgate.brokers.base import Broker, Lease
from taskgate.brokers.params import Claim, Claimed, Finish, ItemAnswer, Settle
from taskgate.errors import BrokerError
from taskgate.runtime.acks import AckWriter
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.scheduler import ACK_ALLOWANCE
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task

pytestmark = pytest.mark.anyio


class Recording:
    """A broker wrapper recording the ack writes (settles that only complete runs): each one's
    size, and whether it asked for the snapshots ("snapshots") or not ("quiet"). Their writes
    can be held, or made to fail (``failures``; `refused` then lists the failed writes' sizes)."""

    def __init__(self, inner: Broker) -> None:
        self._inner = inner
        # A write may block its thread (``hold``): never run it on the event loop. These tests
        # are about the writer's own writes: no ack rides on a claim (test_gate_acks_ride.py).
        self.capabilities = dataclasses.replace(
            inner.capabilities, nonblocking=False, inline_attempts=False, acks_in_claims=False
        )
        self.batches: list[int] = []
        self.kinds: list[str] = []
        self.refused: list[int] = []
        self.hold: threading.Event | None = None
        self.entered = threading.Event()
        self.failures: list[Exception] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def settle(self, settle: Settle) -> list[ItemAnswer]:
        if is_ack_batch(settle):
            self._enter("snapshots" if settle.snapshots else "quiet", settle.items)
        return self._inner.settle(settle)

    def _enter(self, kind: str, items: Sequence[Finish]) -> None:
        self.entered.set()
        if self.hold is not None:
            assert self.hold.wait(GUARD), f"test never released a {kind} write"
        if self.failures:
            self.refused.append(len(items))
            raise self.failures.pop(0)
        self.batches.append(len(items))
        self.kinds.append(kind)


async def test_handlers_finishing_together_are_acked_in_one_batch(gate_broker):
    broker = Recording(gate_broker)
    gate = make_gate(broker, {"q": QueueConfig(workers=5)})
    release, all_started = anyio.Event(), anyio.Event()
    started = 0

    @gate.handler("q")
    async def together(task: Task) -> str:
        nonlocal started
        started += 1
        if started == 5:
            all_started.set()
        await release.wait()
        return task.id

    async with gate:
        ids = await gate.submit_many("q", [None] * 5)
        with anyio.fail_after(GUARD):
            await all_started.wait()
        release.set()
        for task_id in ids:
            done = await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED)
            assert done.result == f'"{task_id}"'.encode()
    assert sum(broker.batches) == 5 and len(broker.batches) <= 2, broker.batches


@pytest.mark.parametrize("hook", [False, True])
async def test_acks_are_quiet_unless_a_hook_reads_the_snapshots(gate_broker, hook):
    broker = Recording(gate_broker)
    seen: list[Task] = []
    # Only the wake-up of the ack itself can answer the waits (the gate's poll is beyond GUARD).
    gate = echo_gate(broker, 3, seen if hook else None)
    async with gate:
        ids = await gate.submit_many("q", [None] * 6)
        with anyio.fail_after(GUARD):
            results = [await gate.wait(task_id) for task_id in ids]  # woken by the ack, quiet or not
    assert results == [f'"{task_id}"'.encode() for task_id in ids]
    assert sum(broker.batches) == 6
    assert set(broker.kinds) == {"snapshots" if hook else "quiet"}
    completed = [t for t in seen if t.status is Status.COMPLETED]
    assert sorted(t.id for t in completed) == (sorted(ids) if hook else [])
    assert all(t.result == f'"{t.id}"'.encode() for t in completed)


async def test_the_next_claim_overlaps_the_ack_write_without_exceeding_workers(gate_broker):
    broker = Recording(gate_broker)
    broker.hold = threading.Event()
    gate = make_gate(broker, {"q": QueueConfig(workers=1)})
    ran: list[str] = []
    inside = 0
    most_inside = 0
    second_started = anyio.Event()

    @gate.handler("q")
    async def quick(task: Task) -> None:
        nonlocal inside, most_inside
        inside += 1
        most_inside = max(most_inside, inside)
        ran.append(task.id)
        if len(ran) == 2:
            second_started.set()
        await anyio.lowlevel.checkpoint()
        inside -= 1

    async with gate:
        first, second = await gate.submit_many("q", [None, None])
        with anyio.fail_after(GUARD):
            await anyio.to_thread.run_sync(broker.entered.wait)
            # The first ack is held in the broker, yet its handler's slot is back: the second
            # task is claimed and run meanwhile.
            await second_started.wait()
        assert ran == [first, second]
        assert (await gate.get(first)).status is Status.RUNNING  # its ack is not written yet
        assert (await gate.stats("q")).running <= 1
        broker.hold.set()
        for task_id in (first, second):
            await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED)
    assert most_inside == 1


async def test_acks_held_back_by_a_stuck_write_stop_the_claims_at_the_allowance(gate_broker):
    broker = Recording(gate_broker)
    broker.hold = threading.Event()
    gate = make_gate(broker, {"q": QueueConfig(workers=1)})
    ran: list[str] = []
    cap = (ACK_ALLOWANCE + 1) * 1  # acks waiting (in flight or queued) before claims stop
    reached = anyio.Event()

    @gate.handler("q")
    async def quick(task: Task) -> None:
        ran.append(task.id)
        if len(ran) == cap:
            reached.set()

    async with gate:
        ids = await gate.submit_many("q", [None] * (cap + 3))
        with anyio.fail_after(GUARD):
            await reached.wait()
        await anyio.sleep(0.05)  # room to over-claim, if the allowance did not hold
        assert len(ran) == cap
        assert (await gate.stats("q")).queue_len == 3
        broker.hold.set()
        for task_id in ids:
            await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED)
    assert sorted(ran) == sorted(ids)


def _held_writes(gate_broker: Broker) -> tuple[Recording, Gate]:
    """A gate on queue ``q`` (2 workers, handlers answering "done") whose ack writes wait,
    in their broker thread, until ``broker.hold`` is set."""
    broker = Recording(gate_broker)
    broker.hold = threading.Event()
    gate = make_gate(broker, {"q": QueueConfig(workers=2)})

    @gate.handler("q")
    async def quick(task: Task) -> str:
        return "done"

    return broker, gate


async def test_shutdown_waits_for_the_ack_flush_in_flight(gate_broker):
    broker, gate = _held_writes(gate_broker)
    async with anyio.create_task_group() as tg:
        await tg.start(gate.run)
        task_id = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await anyio.to_thread.run_sync(broker.entered.wait)
        shut = anyio.Event()

        async def shut_down() -> None:
            await gate.shutdown(timeout=0)
            shut.set()

        tg.start_soon(shut_down)
        await anyio.sleep(0.05)
        assert not shut.is_set()
        broker.hold.set()
        with anyio.fail_after(GUARD):
            await shut.wait()
    assert (await gate.get(task_id)).status is Status.COMPLETED


async def test_a_cancelled_runtime_still_finishes_the_ack_write_in_flight(gate_broker):
    # The batch is out of the writer's queue while its write runs in a broker thread: were
    # the wait for it cancelled, the write would be abandoned and the task left running.
    broker, gate = _held_writes(gate_broker)
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            await tg.start(gate.run)
            task_id = await gate.submit("q")
            await anyio.to_thread.run_sync(broker.entered.wait)
            threading.Timer(0.05, broker.hold.set).start()
            tg.cancel_scope.cancel()
    assert broker.kinds == ["quiet"]
    assert gate_broker.get(task_id).status is Status.COMPLETED


@pytest.mark.parametrize("nonblocking", [True, False])
async def test_acks_of_handlers_that_finished_are_written_when_the_runtime_is_cancelled(
    gate_broker, nonblocking
):
    # On the event loop (a nonblocking broker) the write has no await to cancel; in a thread
    # it is shielded. Either way every finished handler's task ends completed.
    broker = Recording(gate_broker)
    broker.capabilities = dataclasses.replace(broker.capabilities, nonblocking=nonblocking)
    gate = make_gate(broker, {"q": QueueConfig(workers=5)})
    finished: list[str] = []
    all_finished = anyio.Event()

    @gate.handler("q")
    async def quick(task: Task) -> str:
        finished.append(task.id)
        if len(finished) == 5:
            all_finished.set()
        return "done"

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            await tg.start(gate.run)
            ids = await gate.submit_many("q", [None] * 5)
            await all_finished.wait()
            tg.cancel_scope.cancel()
    assert sorted(finished) == sorted(ids)
    assert [gate_broker.get(task_id).status for task_id in ids] == [Status.COMPLETED] * 5


async def test_a_failed_ack_batch_is_written_again(gate_broker):
    broker = Recording(gate_broker)
    broker.failures = [BrokerError("connection dropped")]
    gate = make_gate(broker, {"q": QueueConfig(workers=2)})

    @gate.handler("q")
    async def quick(task: Task) -> str:
        return "done"

    async with gate:
        ids = await gate.submit_many("q", [None, None])
        for task_id in ids:
            await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED)
    assert not broker.failures


async def test_a_batch_the_broker_refuses_is_acked_item_by_item(gate_broker):
    broker = Recording(gate_broker)
    broker.failures = [ValueError("a result too large for the server")]
    gate = make_gate(broker, {"q": QueueConfig(workers=3)})
    release = anyio.Event()

    @gate.handler("q")
    async def together(task: Task) -> str:
        await release.wait()
        return "done"

    async with gate:
        ids = await gate.submit_many("q", [None] * 3)
        await anyio.sleep(0.05)
        release.set()
        for task_id in ids:
            await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED)
    assert (broker.refused, broker.batches) == ([3], [1, 1, 1])  # refused together, then one by one


async def _claimed(broker: Broker, n: int) -> list[Lease]:
    await anyio.to_thread.run_sync(steps.enqueue, broker, [new_task() for _ in range(n)])
    return await anyio.to_thread.run_sync(steps.claim, broker, "q", n, timedelta(seconds=30))


async def test_writer_drops_a_stale_token_alone_and_groups_acks_queued_during_a_write(gate_broker):
    broker = Recording(gate_broker)
    broker.hold = threading.Event()
    settled: list[list[str]] = []

    async def on_settled(tasks: list[Task]) -> None:
        settled.append([t.id for t in tasks])

    writer = AckWriter(broker, BrokerCalls(4), deadline=GUARD, on_settled=on_settled)
    first, good, stale, last = await _claimed(gate_broker, 4)

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        writer.put(first.task.id, first.token, None)
        await anyio.to_thread.run_sync(broker.entered.wait)  # the first write is in flight
        writer.put(good.task.id, good.token, None)
        writer.put(stale.task.id, "stale", None)
        writer.put(last.task.id, last.token, None)
        assert writer.backlog == 4
        broker.hold.set()
        writer.close()
    assert broker.batches == [1, 3]
    assert settled == [[first.task.id], [good.task.id, last.task.id]]
    assert writer.backlog == 0
    assert gate_broker.get(stale.task.id).status is Status.RUNNING
    for lease in (first, good, last):
        assert gate_broker.get(lease.task.id).status is Status.COMPLETED


async def test_a_closed_writer_refuses_acks(gate_broker):
    async def on_settled(tasks: list[Task]) -> None:
        raise AssertionError("nothing was written")

    writer = AckWriter(gate_broker, BrokerCalls(4), deadline=GUARD, on_settled=on_settled)
    writer.close()
    await writer.run()  # returns at once: closed and empty
    with pytest.raises(RuntimeError, match="closed"):
        writer.put("t", "token", None)


async def test_submit_many_gives_each_payload_its_business_key(gate_broker):
    gate = make_gate(gate_broker)
    ids = await gate.submit_many("q", [1, 2, 3], business_keys=["k1", None, "k3"])
    assert [t.id for t in await gate.history("k1")] == [ids[0]]
    assert [t.id for t in await gate.history("k3")] == [ids[2]]
    assert (await gate.get(ids[1])).business_key is None


async def test_submit_many_with_one_used_key_stores_none_of_the_batch(gate_broker):
    gate = make_gate(gate_broker)
    used = await gate.submit("q", business_key="used")
    with pytest.raises(TaskExistsError) as caught:
        await gate.submit_many("q", [1, 2], business_keys=["fresh", "used"])
    assert caught.value.execution_id == used
    assert await gate.history("fresh") == []
    assert await gate.overview() == {"q": {Status.PENDING: 1}}


@pytest.mark.parametrize(
    ("keys", "error"),
    [(["same", "same"], ValueError), (["one"], ValueError), ("ab", TypeError), (["", "x"], ValueError)],
)
async def test_submit_many_refuses_bad_business_keys_and_stores_nothing(gate_broker, keys, error):
    gate = make_gate(gate_broker)
    with pytest.raises(error):
        await gate.submit_many("q", [1, 2], business_keys=keys)
    assert await gate.overview() == {}


class _Threads:
    """Records the thread of every claim; declares ``nonblocking`` as told."""

    def __init__(self, inner: Broker, nonblocking: bool) -> None:
        self._inner = inner
        self.capabilities = dataclasses.replace(
            inner.capabilities, nonblocking=nonblocking, inline_attempts=False
        )
        self.claim_threads: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def claim(self, claim: Claim) -> Claimed:
        self.claim_threads.add(threading.get_ident())
        return self._inner.claim(claim)


@pytest.mark.parametrize("nonblocking", [True, False])
async def test_a_nonblocking_broker_is_called_on_the_event_loop(gate_broker, nonblocking):
    broker = _Threads(gate_broker, nonblocking)
    gate = make_gate(broker)
    gate.handle("q", lambda task: None)
    async with gate:
        task_id = await gate.submit("q")
        await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED)
    on_loop = broker.claim_threads == {threading.get_ident()}
    assert on_loop is nonblocking


class _ClaimOrder:
    """Wakes the queue's scheduler again inside the claim that finds work -- a stale wake-up
    (another process's, a poll's) arriving while the tasks go to the workers -- and records how
    many handlers had started at each later claim."""

    def __init__(self, inner: Broker) -> None:
        self._inner = inner
        self.capabilities = inner.capabilities
        self.gate: Any = None
        self.started = 0
        self.found_work = False
        self.started_at_later_claims: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def claim(self, claim: Claim) -> Claimed:
        if self.found_work:
            self.started_at_later_claims.append(self.started)
        claimed = self._inner.claim(claim)
        if claimed.leases and not self.found_work:
            self.found_work = True
            self.gate._runtime.wake_queue(claim.queue)
        return claimed


async def test_claimed_tasks_start_before_the_queue_claims_again(gate_broker):
    broker = _ClaimOrder(gate_broker)
    gate = broker.gate = make_gate(broker, {"q": QueueConfig(workers=4)})
    all_started, finish = anyio.Event(), anyio.Event()

    @gate.handler("q")
    async def handler(task: Task) -> None:
        broker.started += 1
        if broker.started == 3:
            all_started.set()
        await finish.wait()

    async with gate:
        try:
            await gate.submit_many("q", [None, None, None])
            with anyio.fail_after(GUARD):
                await all_started.wait()
                await until(lambda: _true(broker.started_at_later_claims))
        finally:
            finish.set()
    # A claim on the event loop (inline brokers) holds it: the handlers ran first.
    assert broker.started_at_later_claims[0] == 3


async def _true(value: object) -> bool:
    return bool(value)
