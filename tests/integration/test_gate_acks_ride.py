"""Acks riding on claims: a queue's quiet acks go out with its next claim (`Claim.acks`).

On SQLite and Redis (``acks_in_claims``; on Redis the claim also carries the shared limits).
The wrapper below records which call wrote each ack and can make the carrying call fail once.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from gate_helpers import GUARD, carried, eventually, is_ack_batch, make_gate, units_left
from helpers.redis_servers import purge_keys

from taskgate import ManualClock, QueueConfig, Status, Task
from taskgate.brokers.base import Broker, Lease
from taskgate.brokers.params import Claim, Claimed, Complete, ItemAnswer, Requeue, Settle
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.brokers.sql import SQLBroker  # type: ignore[attr-defined]
from taskgate.errors import BrokerError
from taskgate.runtime.acks import RIDE_MAX, AckWriter
from taskgate.runtime.calls import BrokerCalls
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task

pytestmark = pytest.mark.anyio


class Riding:
    """A broker wrapper recording, per call, which way it wrote how many acks: ``claim`` (carried
    by a claim; `carrying` lists what each such claim carried), ``settle`` (a quiet ack write of
    the writer) or ``settle.snapshots`` (an ack write asking for the snapshots).

    ``refuse`` is raised once by the next carrying claim before anything is written; with
    ``claim_fails`` the next carrying claim writes its acks and answers that its claim failed.
    With ``late`` the next carrying claim, once done, answers only when ``late`` is set (in its
    thread); ``claimed_meanwhile`` is set by any claim made before that. ``put_back`` lists
    the tasks requeued by their lease (what the scheduler does with a claim it gave up on).
    """

    def __init__(self, inner: Broker) -> None:
        self._inner = inner
        self.capabilities = dataclasses.replace(inner.capabilities, nonblocking=False, inline_attempts=False)
        self.writes: list[tuple[str, list[str]]] = []
        self.carrying: list[frozenset[str]] = []
        self.refuse: BaseException | None = None
        self.claim_fails = False
        self.late: threading.Event | None = None
        self.late_leased: list[str] = []
        self.claimed_meanwhile = threading.Event()
        self.put_back: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def claim(self, claim: Claim) -> Claimed:
        if self.late_leased:
            self.claimed_meanwhile.set()
        if not claim.acks:
            return self._inner.claim(claim)
        if self.refuse is not None:
            error, self.refuse = self.refuse, None
            raise error
        if self.claim_fails:
            # The acks written, then the claim failing: no leases, and the failure answered.
            self.claim_fails = False
            self._wrote("claim", claim.acks)
            acked = self._inner.settle(Settle(claim.acks, snapshots=False))
            return Claimed(leases=[], acked=acked, failed=BrokerError("the claim after the acks failed"))
        claimed = self._inner.claim(claim)
        self._wrote("claim", claim.acks)
        self.carrying.append(carried(claim))
        if self.late is not None and not self.late_leased:
            self.late_leased = [lease.task.id for lease in claimed.leases] or ["nothing"]
            assert self.late.wait(GUARD), "the test never let the late call answer"
        return claimed

    def settle(self, settle: Settle) -> list[ItemAnswer]:
        self.put_back += [item.task_id for item in settle.items if isinstance(item, Requeue)]
        if is_ack_batch(settle):
            self._wrote("settle" if not settle.snapshots else "settle.snapshots", settle.items)
        return self._inner.settle(settle)

    def _wrote(self, kind: str, acks: Sequence[Any]) -> None:
        self.writes.append((kind, [ack.task_id for ack in acks]))

    def written(self, kind: str) -> list[str]:
        """Ids of the tasks whose acks went out by ``kind``."""
        return [task_id for name, ids in self.writes if name == kind for task_id in ids]


@pytest.fixture
def sqlite_broker(tmp_path: Path) -> Iterator[Broker]:
    broker = SQLBroker(f"sqlite:///{tmp_path / 'ride.db'}", clock=ManualClock())
    yield broker
    broker.close()


@pytest.fixture
def redis_broker(redis_url: str, unique_prefix: str) -> Iterator[Broker]:
    broker = RedisBroker(redis_url, key_prefix=unique_prefix, clock=ManualClock())
    yield broker
    broker.close()
    client = redis.Redis.from_url(redis_url)
    try:
        purge_keys(client, KeySpace(unique_prefix).pattern())
    finally:
        client.close()


@pytest.fixture(params=["sqlite", "redis"])
def carrying_broker(request: pytest.FixtureRequest) -> Broker:
    """A broker declaring ``acks_in_claims``: SQLite (plain claims) or Redis (limited claims)."""
    broker: Broker = request.getfixturevalue(f"{request.param}_broker")
    assert broker.capabilities.acks_in_claims
    return broker


def _carrying(broker: Riding) -> frozenset[str]:
    """What a claim carrying acks carries on ``broker``: the shared limits too where they are kept."""
    return frozenset({"acks", "shared"} if broker.capabilities.shared_limits else {"acks"})


async def _run_all(
    broker: Riding, count: int, *, workers: int = 2, **options: Any
) -> tuple[list[str], list[str]]:
    """Run ``count`` no-op tasks through a gate over ``broker``: (ids, ids in the order they ran)."""
    gate = make_gate(broker, {"q": QueueConfig(workers=workers)}, **options)
    ran: list[str] = []

    @gate.handler("q")
    async def record(task: Task) -> str:
        ran.append(task.id)
        return task.id

    async with gate:
        ids = await gate.submit_many("q", [None] * count)
        with anyio.fail_after(GUARD):
            results = [await gate.wait(task_id) for task_id in ids]  # woken by the acks
    assert results == [f'"{task_id}"'.encode() for task_id in ids]
    return ids, ran


async def test_acks_of_finished_handlers_ride_on_the_next_claim(carrying_broker):
    broker = Riding(carrying_broker)
    ids, ran = await _run_all(broker, 8)
    taken = broker.written("claim")
    assert taken, broker.writes  # at least one claim took acks along
    assert set(broker.carrying) == {_carrying(broker)}
    assert sorted(taken + broker.written("settle")) == sorted(ids)  # each written once
    assert sorted(ran) == sorted(ids)


async def test_acks_ride_on_claims_within_a_quota_which_counts_each_start_once(sqlite_broker):
    broker = Riding(sqlite_broker)
    quota = QueueConfig(workers=2, quota_limit=100, quota_period="1h")
    gate = make_gate(broker, {"q": quota})
    gate.handle("q", lambda task: None)
    async with gate:
        ids = await gate.submit_many("q", [None] * 8)
        with anyio.fail_after(GUARD):
            for task_id in ids:
                await gate.wait(task_id)
    taken = broker.written("claim")
    assert taken and sorted(taken + broker.written("settle")) == sorted(ids)
    assert set(broker.carrying) == {frozenset({"acks", "quota", "shared"})}
    assert units_left(sqlite_broker, "q", 100, timedelta(hours=1)) == 92


async def test_acks_do_not_ride_when_a_hook_reads_their_snapshots(carrying_broker):
    broker = Riding(carrying_broker)
    seen: list[Task] = []
    ids, _ = await _run_all(broker, 6, on_state_change=seen.append)
    assert broker.written("claim") == [] and broker.written("settle") == []
    assert sorted(broker.written("settle.snapshots")) == sorted(ids)
    assert sorted(t.id for t in seen if t.status is Status.COMPLETED) == sorted(ids)


@pytest.mark.parametrize("error", [BrokerError("connection dropped"), ValueError("a result too large")])
async def test_acks_a_claim_could_not_take_along_are_written_by_the_writer(carrying_broker, error):
    broker = Riding(carrying_broker)
    broker.refuse = error
    ids, ran = await _run_all(broker, 8)
    assert broker.refuse is None  # the carrying call was tried, and refused
    written = broker.written("claim") + broker.written("settle")
    assert sorted(written) == sorted(ids) and sorted(ran) == sorted(ids)  # no ack lost, none run twice
    for task_id in ids:
        assert (await anyio.to_thread.run_sync(carrying_broker.get, task_id)).status is Status.COMPLETED


async def test_acks_written_by_a_claim_that_then_failed_are_not_written_again(carrying_broker):
    broker = Riding(carrying_broker)
    broker.claim_fails = True
    ids, ran = await _run_all(broker, 8)
    assert not broker.claim_fails  # a carrying call wrote its acks and answered no claim
    written = broker.written("claim") + broker.written("settle")
    assert sorted(written) == sorted(ids) and sorted(ran) == sorted(ids)


async def test_a_carrying_claim_that_answers_after_its_deadline_puts_its_tasks_back(sqlite_broker):
    # The scheduler gives up on the carrying claim (deadline ttl/4) while its thread still
    # leases a task. The clock is manual: no lease expires, so only putting the late lease back
    # runs that task; the acks it carried go back to the writer (written again: lease-lost).
    # On a slow machine an ordinary claim may miss its deadline too: its leases are put back
    # as well, and each put-back costs its task one more claim.
    broker = Riding(sqlite_broker)
    broker.late = threading.Event()
    gate = make_gate(broker, {"q": QueueConfig(workers=1, lease_ttl=0.6)})
    ran: list[str] = []
    gate.handle("q", lambda task: ran.append(task.id))
    async with gate:
        ids = await gate.submit_many("q", [None] * 3)
        with anyio.fail_after(GUARD):
            await anyio.to_thread.run_sync(broker.claimed_meanwhile.wait)  # it gave up on the late call
        broker.late.set()
        done = [await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED) for task_id in ids]
    (late_leased,) = broker.late_leased
    assert sorted(ran) == sorted(ids)  # each ran once: the late lease was put back, not run twice
    assert late_leased in broker.put_back
    assert {task.id: task.claims for task in done}[late_leased] == 1 + broker.put_back.count(late_leased)


# -- the writer's side ----------------------------------------------------------------------


async def _held(broker: Broker, n: int) -> list[Lease]:
    await anyio.to_thread.run_sync(steps.enqueue, broker, [new_task() for _ in range(n)])
    return await anyio.to_thread.run_sync(steps.claim, broker, "q", n, timedelta(seconds=30))


def _claiming(broker: Broker, took: list[int]) -> Any:
    """A writer's claim of queue "other" on ``broker``, noting how many acks each took along."""

    async def claim(acks: tuple[Complete, ...]) -> Claimed:
        took.append(len(acks))
        return await anyio.to_thread.run_sync(
            broker.claim, Claim("other", 1, timedelta(seconds=30), acks=acks)
        )

    return claim


async def test_up_to_ride_max_acks_ride_and_more_go_in_a_write_of_their_own(sqlite_broker):
    completed: list[str] = []

    async def on_settled(tasks: list[Task]) -> None:
        raise AssertionError("quiet acks settle by id")

    writer = AckWriter(
        sqlite_broker, BrokerCalls(2), deadline=GUARD, on_settled=on_settled, on_completed=completed.extend
    )
    assert writer.rides_on_claims
    took: list[int] = []

    few = await _held(sqlite_broker, RIDE_MAX)
    for lease in few:
        writer.put(lease.task.id, lease.token, None)
    await writer.with_claim(_claiming(sqlite_broker, took))
    assert took == [RIDE_MAX] and sorted(completed) == sorted(lease.task.id for lease in few)
    assert writer.backlog == 0

    many = await _held(sqlite_broker, RIDE_MAX + 1)
    for lease in many:
        writer.put(lease.task.id, lease.token, None)
    await writer.with_claim(_claiming(sqlite_broker, took))
    assert took == [RIDE_MAX, 0] and writer.backlog == RIDE_MAX + 1  # claimed alone, left to the writer
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        writer.close()
    assert sorted(completed) == sorted(lease.task.id for lease in [*few, *many])


async def test_a_writer_whose_acks_a_hook_reads_never_lets_them_ride(sqlite_broker):
    async def on_settled(tasks: list[Task]) -> None:
        pass

    writer = AckWriter(sqlite_broker, BrokerCalls(2), deadline=GUARD, on_settled=on_settled)
    assert not writer.rides_on_claims
    (lease,) = await _held(sqlite_broker, 1)
    writer.put(lease.task.id, lease.token, None)
    took: list[int] = []
    await writer.with_claim(_claiming(sqlite_broker, took))
    assert took == [0] and writer.backlog == 1  # acks a hook reads do not ride


async def test_acks_a_failed_claim_wrote_are_answered_and_not_queued_again(sqlite_broker):
    completed: list[str] = []
    written = 0

    async def on_settled(tasks: list[Task]) -> None:
        raise AssertionError("quiet acks settle by id")

    def on_written() -> None:
        nonlocal written
        written += 1

    writer = AckWriter(
        sqlite_broker,
        BrokerCalls(2),
        deadline=GUARD,
        on_settled=on_settled,
        on_completed=completed.extend,
        on_written=on_written,
    )
    held = await _held(sqlite_broker, 2)
    for lease in held:
        writer.put(lease.task.id, lease.token, None)

    async def claim(acks: tuple[Complete, ...]) -> Claimed:
        if not acks:
            raise AssertionError("the acks were waiting: they ride")
        acked = await anyio.to_thread.run_sync(sqlite_broker.settle, Settle(acks, snapshots=False))
        return Claimed(leases=[], acked=acked, failed=BrokerError("the claim failed"))

    with pytest.raises(BrokerError, match=r"claim after 2 ack\(s\) failed \(the acks were written\)"):
        await writer.with_claim(claim)
    assert sorted(completed) == sorted(lease.task.id for lease in held)  # waiters are told
    assert (writer.backlog, written) == (0, 1)
