"""Acks riding on claims: a queue's quiet acks go out with its next claim (`AckCarrier`).

On SQLite (``acks_in_claims``, the plain claim) and Redis (its limited claim). The wrapper
below records which call wrote each ack and can make the carrying call fail once.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
import redis
from gate_helpers import GUARD, eventually, make_gate
from helpers.redis_servers import purge_keys

from taskgate import ManualClock, QueueConfig, Status, Task
from taskgate.brokers.base import AckCarrier, AckItem, Broker, Lease, LimitedAckCarrier, QuietAcker
from taskgate.brokers.base import QuietAckOutcome as Answer
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.brokers.sql import SQLBroker  # type: ignore[attr-defined]
from taskgate.errors import BrokerError
from taskgate.runtime.acks import RIDE_MAX, AckWriter
from taskgate.runtime.calls import BrokerCalls
from taskgate.testing.contract._support import new_task

pytestmark = pytest.mark.anyio


class Riding:
    """A broker wrapper recording, per call, which method wrote how many acks.

    ``refuse`` is raised once by the next carrying call before anything is written; with
    ``claim_fails`` the next carrying call writes its acks and answers its claim with None.
    With ``late`` the next carrying call, once done, answers only when ``late`` is set (in its
    thread); ``claimed_meanwhile`` is set by any claim made before that. ``put_back`` lists
    the tasks requeued by their lease (what the scheduler does with a claim it gave up on).
    """

    def __init__(self, inner: Broker) -> None:
        self._inner = inner
        self.capabilities = dataclasses.replace(inner.capabilities, nonblocking=False, inline_attempts=False)
        self.writes: list[tuple[str, list[str]]] = []
        self.refuse: BaseException | None = None
        self.claim_fails = False
        self.late: threading.Event | None = None
        self.late_leased: list[str] = []
        self.claimed_meanwhile = threading.Event()
        self.put_back: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def claim(self, queue: str, limit: int, lease_ttl: timedelta) -> list[Lease]:
        self._note_claim()
        return self._inner.claim(queue, limit, lease_ttl)

    def requeue(self, task_id: str, token: str) -> Task:
        self.put_back.append(task_id)
        return self._inner.requeue(task_id, token)

    def ack_many_quiet(self, items: Sequence[AckItem]) -> list[Answer]:
        self.writes.append(("ack_many_quiet", [item[0] for item in items]))
        return _quiet(self._inner).ack_many_quiet(items)

    def claim_after_acks(
        self, items: Sequence[AckItem], queue: str, limit: int, lease_ttl: timedelta
    ) -> tuple[list[Answer], list[Lease] | None]:
        if self._before_carrying():
            return self._acks_alone("claim_after_acks", items)
        answers, leases = _carrier(self._inner).claim_after_acks(items, queue, limit, lease_ttl)
        return self._after_carrying("claim_after_acks", items, answers, leases)

    def claim_with_limits_after_acks(self, items: Sequence[AckItem], *args: Any, **kwargs: Any) -> Any:
        if self._before_carrying():
            return self._acks_alone("claim_with_limits_after_acks", items)
        inner = _limited_carrier(self._inner)
        answers, taken = inner.claim_with_limits_after_acks(items, *args, **kwargs)
        return self._after_carrying("claim_with_limits_after_acks", items, answers, taken)

    def claim_within_quota_after_acks(self, items: Sequence[AckItem], *args: Any, **kwargs: Any) -> Any:
        if self._before_carrying():
            return self._acks_alone("claim_within_quota_after_acks", items)
        answers, taken = _carrier(self._inner).claim_within_quota_after_acks(items, *args, **kwargs)
        return self._after_carrying("claim_within_quota_after_acks", items, answers, taken)

    def _note_claim(self) -> None:
        if self.late_leased:
            self.claimed_meanwhile.set()

    def _before_carrying(self) -> bool:
        """Raise ``refuse``; True when this call's claim is to fail after its acks."""
        self._note_claim()
        if self.refuse is not None:
            error, self.refuse = self.refuse, None
            raise error
        failing, self.claim_fails = self.claim_fails, False
        return failing

    def _acks_alone(self, name: str, items: Sequence[AckItem]) -> tuple[list[Answer], None]:
        """The acks written, then the claim failing: what the broker answers is None."""
        self.writes.append((name, [item[0] for item in items]))
        return _quiet(self._inner).ack_many_quiet(items), None

    def _after_carrying(
        self, name: str, items: Sequence[AckItem], answers: list[Answer], claimed: Any
    ) -> Any:
        self.writes.append((name, [item[0] for item in items]))
        if self.late is not None and not self.late_leased:
            leases = claimed if isinstance(claimed, list) else claimed.leases
            self.late_leased = [lease.task.id for lease in leases] or ["nothing"]
            assert self.late.wait(GUARD), "the test never let the late call answer"
        return answers, claimed

    def written(self, kind: str) -> list[str]:
        """Ids of the tasks whose acks went out by ``kind``."""
        return [task_id for name, ids in self.writes if name == kind for task_id in ids]


def _quiet(broker: Broker) -> QuietAcker:
    return cast(QuietAcker, broker)


def _carrier(broker: Broker) -> AckCarrier:
    return cast(AckCarrier, broker)


def _limited_carrier(broker: Broker) -> LimitedAckCarrier:
    return cast(LimitedAckCarrier, broker)


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


CARRYING = {"sqlite": "claim_after_acks", "redis": "claim_with_limits_after_acks"}


def _carrying_call(broker: Riding) -> str:
    return CARRYING["redis" if broker.capabilities.distributed_limits else "sqlite"]


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
    carried = broker.written(_carrying_call(broker))
    assert carried, broker.writes  # at least one claim took acks along
    assert sorted(carried + broker.written("ack_many_quiet")) == sorted(ids)  # each written once
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
    carried = broker.written("claim_within_quota_after_acks")
    assert carried and sorted(carried + broker.written("ack_many_quiet")) == sorted(ids)
    assert sqlite_broker.reserve_quota("q", 100, timedelta(hours=1), 100).granted == 92


async def test_acks_do_not_ride_when_a_hook_reads_their_snapshots(carrying_broker):
    broker = Riding(carrying_broker)
    seen: list[Task] = []
    ids, _ = await _run_all(broker, 6, on_state_change=seen.append)
    assert broker.written(_carrying_call(broker)) == [] and broker.written("ack_many_quiet") == []
    assert sorted(t.id for t in seen if t.status is Status.COMPLETED) == sorted(ids)


@pytest.mark.parametrize("error", [BrokerError("connection dropped"), ValueError("a result too large")])
async def test_acks_a_claim_could_not_take_along_are_written_by_the_writer(carrying_broker, error):
    broker = Riding(carrying_broker)
    broker.refuse = error
    ids, ran = await _run_all(broker, 8)
    assert broker.refuse is None  # the carrying call was tried, and refused
    written = broker.written(_carrying_call(broker)) + broker.written("ack_many_quiet")
    assert sorted(written) == sorted(ids) and sorted(ran) == sorted(ids)  # no ack lost, none run twice
    for task_id in ids:
        assert (await anyio.to_thread.run_sync(carrying_broker.get, task_id)).status is Status.COMPLETED


async def test_acks_written_by_a_claim_that_then_failed_are_not_written_again(carrying_broker):
    broker = Riding(carrying_broker)
    broker.claim_fails = True
    ids, ran = await _run_all(broker, 8)
    assert not broker.claim_fails  # a carrying call wrote its acks and answered no claim
    written = broker.written(_carrying_call(broker)) + broker.written("ack_many_quiet")
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
    await anyio.to_thread.run_sync(broker.enqueue, [new_task() for _ in range(n)])
    return await anyio.to_thread.run_sync(broker.claim, "q", n, timedelta(seconds=30))


async def test_up_to_ride_max_acks_ride_and_more_go_in_a_write_of_their_own(sqlite_broker):
    completed: list[str] = []

    async def on_settled(tasks: list[Task]) -> None:
        raise AssertionError("quiet acks settle by id")

    writer = AckWriter(
        sqlite_broker, BrokerCalls(2), deadline=GUARD, on_settled=on_settled, on_completed=completed.extend
    )
    assert writer.rides_on_claims
    took: list[int] = []

    async def alone() -> str:
        return "alone"

    async def after_acks(acks: list[AckItem]) -> tuple[list[Answer], str]:
        took.append(len(acks))
        answers, _ = await anyio.to_thread.run_sync(
            _carrier(sqlite_broker).claim_after_acks, acks, "other", 1, timedelta(seconds=30)
        )
        return answers, "carried"

    few = await _held(sqlite_broker, RIDE_MAX)
    for lease in few:
        writer.put(lease.task.id, lease.token, None)
    assert await writer.with_claim(alone, after_acks) == "carried"
    assert took == [RIDE_MAX] and sorted(completed) == sorted(lease.task.id for lease in few)
    assert writer.backlog == 0

    many = await _held(sqlite_broker, RIDE_MAX + 1)
    for lease in many:
        writer.put(lease.task.id, lease.token, None)
    assert await writer.with_claim(alone, after_acks) == "alone"
    assert took == [RIDE_MAX] and writer.backlog == RIDE_MAX + 1  # left to the writer
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

    async def alone() -> str:
        return "alone"

    async def after_acks(acks: list[AckItem]) -> tuple[list[Answer], str]:
        raise AssertionError("acks a hook reads must not ride")

    assert await writer.with_claim(alone, after_acks) == "alone" and writer.backlog == 1


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

    async def alone() -> str:
        raise AssertionError("the acks were waiting: they ride")

    async def after_acks(acks: list[AckItem]) -> tuple[list[Answer], None]:
        return await anyio.to_thread.run_sync(_quiet(sqlite_broker).ack_many_quiet, acks), None

    with pytest.raises(BrokerError, match=r"claim after 2 ack\(s\) failed \(the acks were written\)"):
        await writer.with_claim(alone, after_acks)
    assert sorted(completed) == sorted(lease.task.id for lease in held)  # waiters are told
    assert (writer.backlog, written) == (0, 1)
