"""Leases: manual heartbeats and renew_lease, the reaper, self-fencing, and cancelling running work."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from gate_helpers import GUARD, Faulty, eventually, make_gate

from taskgate import (
    AlreadyFinalError,
    BrokerError,
    LeaseLostError,
    NoTaskError,
    QueueConfig,
    Status,
    Task,
    TaskCanceledError,
    TaskFailedError,
    renew_lease,
)
from taskgate.brokers.params import Heartbeat, Renewal, Requeue
from taskgate.runtime import renew_lease_sync

pytestmark = pytest.mark.anyio

MANUAL = {"q": QueueConfig(workers=2, manual_heartbeat=True)}


async def test_renew_lease_outside_a_handler_raises_no_task():
    with pytest.raises(NoTaskError):
        await renew_lease()
    with pytest.raises(NoTaskError):
        renew_lease_sync()


async def test_renew_lease_extends_and_reports_a_reaped_lease(gate_broker, clock):
    gate = make_gate(gate_broker, MANUAL)
    inside, go, reported = anyio.Event(), anyio.Event(), anyio.Event()
    errors: list[BaseException] = []

    @gate.handler("q")
    async def long(task: Task) -> str:
        if task.claims > 1:
            return "second run"
        await renew_lease()  # a healthy renewal just works
        inside.set()
        await go.wait()
        try:
            await renew_lease()
        except LeaseLostError as exc:
            errors.append(exc)
            reported.set()
            raise
        return "stale result"

    async with gate:
        task_id = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await inside.wait()
        clock.advance(timedelta(seconds=61))  # no automatic heartbeat: the lease runs out
        # another process's reaper takes it back; this process runs it again
        await anyio.to_thread.run_sync(lambda: gate_broker.reap(lease_lost_max=3))
        assert await gate.wait(task_id, timeout=GUARD) == b'"second run"'
        go.set()
        with anyio.fail_after(GUARD):
            await reported.wait()
    task = await gate.get(task_id)
    assert (task.status, task.result, task.lease_lost, task.claims) == (
        Status.COMPLETED,
        b'"second run"',
        1,
        2,
    )


async def test_renew_lease_reports_a_cancel_and_cancels_the_handler(gate_broker):
    gate = make_gate(gate_broker, MANUAL)
    inside, go, done = anyio.Event(), anyio.Event(), anyio.Event()
    seen: list[str] = []

    @gate.handler("q")
    async def long(task: Task) -> None:
        inside.set()
        await go.wait()
        try:
            await renew_lease()
        except TaskCanceledError:
            seen.append("canceled")
        try:
            await anyio.sleep(30)  # the scope is being cancelled: this returns at once
        finally:
            done.set()

    async with gate:
        task_id = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await inside.wait()
        # a cancel from another process only marks the running task
        await anyio.to_thread.run_sync(gate_broker.cancel, task_id)
        go.set()
        with anyio.fail_after(GUARD):
            await done.wait()
        with pytest.raises(TaskFailedError) as failed:
            await gate.wait(task_id, timeout=GUARD)
    assert seen == ["canceled"] and failed.value.task.status is Status.CANCELED


async def test_renew_lease_sync_works_in_a_thread_handler(gate_broker):
    gate = make_gate(gate_broker, MANUAL)

    @gate.handler("q")
    def blocking(task: Task) -> str:
        renew_lease_sync()
        return "renewed"

    async with gate:
        assert await gate.wait(await gate.submit("q"), timeout=GUARD) == b'"renewed"'


async def _hangs_until_reaped_then_recovers(gate: Any, clock: Any, on_rerun: Any = lambda: None) -> Task:
    """Run a task whose first claim hangs until its lease is reaped (the manual clock jumps past
    it) and whose second claim returns; the first copy must be stopped. The task at the end."""
    first_started, first_stopped = anyio.Event(), anyio.Event()

    @gate.handler("q")
    async def hangs_once(task: Task) -> str:
        if task.claims > 1:
            on_rerun()
            return "recovered"
        first_started.set()
        try:
            await anyio.sleep_forever()
        finally:
            first_stopped.set()  # the local copy is stopped once its lease is reaped

    async with gate:
        task_id = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await first_started.wait()
        clock.advance(timedelta(seconds=61))
        assert await gate.wait(task_id, timeout=GUARD) == b'"recovered"'
        with anyio.fail_after(GUARD):
            await first_stopped.wait()
    return await gate.get(task_id)


async def test_the_reaper_takes_back_an_expired_lease_and_it_runs_again(gate_broker, clock):
    task = await _hangs_until_reaped_then_recovers(make_gate(gate_broker, MANUAL, reap_interval=0.02), clock)
    assert (task.lease_lost, task.claims, task.attempts) == (1, 2, 0)


class ReapAnsweredLate(Faulty):
    """``reap`` answers only after the test says so (a slow reaper round trip): meanwhile the
    task it put back can be claimed and run again in this very process."""

    def __init__(self, inner: Any) -> None:
        # reap blocks its thread: no call of this wrapper may run on the event loop.
        super().__init__(
            inner, dataclasses.replace(inner.capabilities, nonblocking=False, inline_attempts=False)
        )
        self.answer = threading.Event()

    def reap(self, **options: Any) -> list[Task]:
        reaped = self._inner.reap(**options)
        if reaped:
            assert self.answer.wait(GUARD), "the test never let reap answer"
        return reaped


async def test_a_reaped_handler_is_stopped_even_when_its_task_ran_again_here_first(gate_broker, clock):
    """The same task twice in one process (the reaped claim still running, the new one done):
    the reaper's answer must stop the old claim's handler, not look for the new one."""
    broker = ReapAnsweredLate(gate_broker)
    gate = make_gate(broker, MANUAL, reap_interval=0.02)
    # The second run lets the reaper answer: it ran before the answer came back.
    task = await _hangs_until_reaped_then_recovers(gate, clock, on_rerun=broker.answer.set)
    assert (task.status, task.lease_lost, task.claims) == (Status.COMPLETED, 1, 2)


async def test_a_worker_that_cannot_heartbeat_fences_itself_before_its_lease_ends(gate_broker):
    broker = Faulty(gate_broker)
    broker.failing["heartbeat"] = BrokerError("connection is half-open")
    ttl = FENCED_TTL
    await _stopped_before_the_lease_ends(make_gate(broker, {"q": QueueConfig(workers=1, lease_ttl=ttl)}), ttl)
    assert broker.calls["heartbeat"] >= 1


class HangingHeartbeats(Faulty):
    """Heartbeats block (a half-open connection) until the test ends."""

    def __init__(self, inner: Any) -> None:
        # A blocking call must never run on the event loop (the memory broker's calls do).
        super().__init__(
            inner, dataclasses.replace(inner.capabilities, nonblocking=False, inline_attempts=False)
        )
        self.release = threading.Event()
        self.heartbeats = 0

    def heartbeat(self, *args: Any) -> Any:
        self.heartbeats += 1
        self.release.wait(GUARD)
        raise BrokerError("the heartbeat never got through")


# A lease short enough for a quick test, long enough that the fence's margin (FENCE_MARGIN of
# it: 75 ms) outlasts a stall of a loaded machine's event loop (0.6 s, a 30 ms margin, once
# stopped the handler 0.26 s past the lease's end).
FENCED_TTL = 1.5


async def _stopped_before_the_lease_ends(gate: Any, ttl: float) -> None:
    times: dict[str, float] = {}
    stopped = anyio.Event()

    @gate.handler("q")
    async def long(task: Task) -> str:
        times["start"] = anyio.current_time()
        try:
            await anyio.sleep_forever()
        finally:
            times["stop"] = anyio.current_time()
            stopped.set()
        return "never"  # pragma: no cover

    async with gate:
        task_id = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await stopped.wait()
        assert times["stop"] - times["start"] < ttl
        task = await gate.get(task_id)
        assert task.status is Status.RUNNING and task.result is None  # nothing written


async def test_a_worker_whose_heartbeats_hang_fences_itself_before_its_lease_ends(gate_broker):
    broker = HangingHeartbeats(gate_broker)
    ttl = FENCED_TTL
    try:
        await _stopped_before_the_lease_ends(
            make_gate(broker, {"q": QueueConfig(workers=1, lease_ttl=ttl)}), ttl
        )
    finally:
        broker.release.set()
    assert broker.heartbeats >= 1


class LateFirstClaim(Faulty):
    """The first claim leases its tasks, then answers only after the test releases it."""

    def __init__(self, inner: Any) -> None:
        super().__init__(
            inner, dataclasses.replace(inner.capabilities, nonblocking=False, inline_attempts=False)
        )
        self.release, self.claimed_again = threading.Event(), threading.Event()
        self.claims = 0

    def claim(self, *args: Any) -> Any:
        self.claims += 1
        if self.claims == 2:
            self.claimed_again.set()
        leases = self._inner.claim(*args)
        if self.claims == 1:
            self.release.wait(GUARD)
        return leases


async def test_a_claim_that_answers_after_its_deadline_puts_its_tasks_back(gate_broker):
    # The scheduler gave up on the first claim (deadline ttl/4); its thread still leased the
    # task. The clock is manual: no lease expires, so only putting the late leases back runs it.
    # On a slow machine a later claim may miss its deadline too: each put-back costs one claim.
    broker = LateFirstClaim(gate_broker)
    gate = make_gate(broker, {"q": QueueConfig(workers=1, lease_ttl=0.6)})
    gate.handle("q", lambda task: b"ran")
    try:
        async with gate:
            task_id = await gate.submit("q")
            # The scheduler gave up on the first claim and claims again.
            assert await anyio.to_thread.run_sync(broker.claimed_again.wait, GUARD)
            broker.release.set()
            assert await gate.wait(task_id, timeout=GUARD) == b"ran"
    finally:
        broker.release.set()
    task = await anyio.to_thread.run_sync(gate_broker.get, task_id)
    put_back = len(broker.settled_as(Requeue))
    assert put_back >= 1 and task.lease_lost == 0 and task.claims == 1 + put_back


async def test_a_manual_heartbeat_handler_that_never_renews_is_fenced_before_its_lease_ends(gate_broker):
    ttl = FENCED_TTL
    queues = {"q": QueueConfig(workers=1, lease_ttl=ttl, manual_heartbeat=True)}
    await _stopped_before_the_lease_ends(make_gate(gate_broker, queues), ttl)


@pytest.fixture
def redis_broker(redis_url: str, unique_prefix: str, client: Any) -> Iterator[Any]:
    """A `RedisBroker` (server clock): its queues run under global slots, renewed with the lease."""
    from helpers.redis_servers import purge_keys

    from taskgate.brokers.redis import RedisBroker
    from taskgate.brokers.redis.keys import KeySpace

    broker = RedisBroker(redis_url, key_prefix=unique_prefix)
    yield broker
    broker.close()
    purge_keys(client, KeySpace(unique_prefix).pattern())


async def test_a_worker_that_cannot_renew_its_global_slot_fences_itself_before_the_slot_expires(
    redis_broker,
):
    # The heartbeats that renew the lease's slot with it do not get through: the slot expires
    # one ttl after its last renewal, and another process may then take it, so the handler
    # must be stopped by then.
    broker = Faulty(redis_broker)
    broker.failing["heartbeat.slot"] = BrokerError("the slot renewal failed")
    ttl = FENCED_TTL
    await _stopped_before_the_lease_ends(make_gate(broker, {"q": QueueConfig(workers=1, lease_ttl=ttl)}), ttl)
    assert broker.calls["heartbeat.slot"] >= 1


class LostSlots(Faulty):
    """Heartbeats renew the lease, and each that renews its slot too answers the slot lost
    (it expired)."""

    def heartbeat(self, heartbeat: Heartbeat) -> Renewal:
        renewal = self._inner.heartbeat(heartbeat)
        if heartbeat.slot_queue is None:
            return renewal
        self.calls["heartbeat.slot"] = self.calls.get("heartbeat.slot", 0) + 1
        return dataclasses.replace(renewal, slot_lost=True)


async def test_a_handler_whose_global_slot_was_lost_is_stopped(redis_broker):
    broker = LostSlots(redis_broker)
    ttl = FENCED_TTL
    await _stopped_before_the_lease_ends(make_gate(broker, {"q": QueueConfig(workers=1, lease_ttl=ttl)}), ttl)
    assert broker.calls["heartbeat.slot"] == 1  # stopped at its first renewal


async def test_cancel_of_a_running_task_stops_its_handler_at_once_and_cancels_its_chain(gate_broker):
    gate = make_gate(gate_broker)
    started, stopped = anyio.Event(), anyio.Event()

    @gate.handler("q")
    async def long(task: Task) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            stopped.set()

    async with gate:
        parent = await gate.submit("q")
        child = await gate.submit("q", depends_on=[parent])
        grandchild = await gate.submit("q", depends_on=[child])
        with anyio.fail_after(GUARD):
            await started.wait()
        marked = await gate.cancel(parent)
        assert marked.status is Status.RUNNING and marked.cancel_requested
        with anyio.fail_after(GUARD):
            await stopped.wait()
        for task_id in (parent, child, grandchild):
            with pytest.raises(TaskFailedError) as failed:
                await gate.wait(task_id, timeout=GUARD)
            assert failed.value.task.status is Status.CANCELED
        with pytest.raises(AlreadyFinalError):
            await gate.cancel(parent)


@pytest.mark.parametrize("swallows", [False, True], ids=["cancelled", "swallows-the-cancel"])
async def test_a_worker_whose_handler_was_stopped_goes_on_with_the_next_tasks(gate_broker, swallows):
    # One worker: the stop spends its cancel scope -- also when the handler swallows the
    # cancellation, which it should not -- and the next tasks run in a new scope. A handler
    # that returned keeps its result.
    gate = make_gate(gate_broker, {"q": QueueConfig(workers=1)})
    started = anyio.Event()

    @gate.handler("q")
    async def handle(task: Task) -> bytes:
        if task.payload == b"long":
            started.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                if swallows:
                    return b"swallowed"
                raise
        await anyio.lowlevel.checkpoint()  # a spent scope would cancel it
        return b"done"

    async with gate:
        long = await gate.submit("q", b"long")
        with anyio.fail_after(GUARD):
            await started.wait()
        await gate.cancel(long)
        if swallows:
            assert await gate.wait(long, timeout=GUARD) == b"swallowed"
        else:
            with pytest.raises(TaskFailedError):
                await gate.wait(long, timeout=GUARD)
        later = [await gate.submit("q", b"short") for _ in range(3)]
        for task_id in later:
            assert await gate.wait(task_id, timeout=GUARD) == b"done"


async def test_a_cancel_from_another_process_is_seen_on_the_next_heartbeat(gate_broker):
    gate = make_gate(gate_broker, {"q": QueueConfig(workers=1, lease_ttl=0.6)})
    started = anyio.Event()

    @gate.handler("q")
    async def long(task: Task) -> None:
        started.set()
        await anyio.sleep_forever()

    async with gate:
        task_id = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await started.wait()
        await anyio.to_thread.run_sync(gate_broker.cancel, task_id)
        with pytest.raises(TaskFailedError) as failed:
            await gate.wait(task_id, timeout=GUARD)
    assert failed.value.task.status is Status.CANCELED


async def test_cancel_of_a_waiting_task_is_immediate(gate_broker):
    gate = make_gate(gate_broker)
    task_id = await gate.submit("q", delay="1h")
    assert (await gate.cancel(task_id)).status is Status.CANCELED
    task = await eventually(gate, task_id, lambda t: t.status.is_final)
    assert task.status is Status.CANCELED


class CountedHeartbeats(Faulty):
    """Sets ``renewed`` once the ``wanted``-th heartbeat has answered."""

    def __init__(self, inner: Any, wanted: int) -> None:
        super().__init__(inner)
        self.wanted, self.renewed = wanted, threading.Event()

    def heartbeat(self, *args: Any) -> Any:
        renewal = self._inner.heartbeat(*args)
        self.calls["heartbeat"] = self.calls.get("heartbeat", 0) + 1
        if self.calls["heartbeat"] >= self.wanted:
            self.renewed.set()
        return renewal


async def test_a_short_lease_started_while_the_keeper_waits_for_a_long_one_is_kept(gate_broker):
    # The keeper sleeps towards the long lease's first renewal (20 s away) when the short one
    # starts: the short one's renewal (0.2 s away) must wake it, or no renewal comes in time.
    queues = {"slow": QueueConfig(workers=1, lease_ttl=60), "fast": QueueConfig(workers=1, lease_ttl=0.6)}
    broker = CountedHeartbeats(gate_broker, wanted=3)  # every ttl/3 through a ttl: the fast lease's
    gate = make_gate(broker, queues)  # type: ignore[arg-type]
    slow_started, slow_may_end = anyio.Event(), anyio.Event()

    @gate.handler("slow")
    async def slow(task: Task) -> None:
        slow_started.set()
        await slow_may_end.wait()

    @gate.handler("fast")
    async def fast(task: Task) -> str:
        assert await anyio.to_thread.run_sync(broker.renewed.wait, GUARD), "the short lease was not renewed"
        return "kept"

    async with gate:
        try:
            await gate.submit("slow")
            with anyio.fail_after(GUARD):
                await slow_started.wait()
            task_id = await gate.submit("fast")
            await gate.wait(task_id, timeout=GUARD)
            done = await gate.get(task_id)
        finally:
            slow_may_end.set()
    assert (done.status, done.result_json(), done.lease_lost, done.claims) == (Status.COMPLETED, "kept", 0, 1)
