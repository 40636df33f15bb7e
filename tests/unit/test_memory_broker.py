"""MemoryBroker behaviour beyond the contract suite: lifecycle, real-clock waits, internals' limits."""

from __future__ import annotations

import time
import tracemalloc
from datetime import UTC, datetime, timedelta

import pytest

from taskgate.brokers.base import Broker, FailureKind, NewTask, QuotaGrant
from taskgate.brokers.memory import MemoryBroker
from taskgate.brokers.memory._quota import window_bounds
from taskgate.clock import ManualClock
from taskgate.errors import BrokerError
from taskgate.ids import new_id
from taskgate.task import TASK_FIELDS, Filter, Status

TTL = timedelta(seconds=30)


def _task(**fields: object) -> NewTask:
    return NewTask(id=new_id(), type="t", queue="q", **fields)  # type: ignore[arg-type]


def test_memory_broker_satisfies_the_broker_protocol() -> None:
    broker = MemoryBroker()
    assert isinstance(broker, Broker)
    assert broker.capabilities.shared_quota is True
    assert broker.capabilities.cross_process is False


def test_without_a_clock_the_system_clock_stamps_tasks() -> None:
    before = datetime.now(UTC)
    (task,) = MemoryBroker().enqueue([_task()])
    assert before <= task.created_at <= datetime.now(UTC)


def test_every_call_after_close_raises_broker_error() -> None:
    broker = MemoryBroker()
    (task,) = broker.enqueue([_task()])
    broker.close()
    broker.close()
    for call in (lambda: broker.get(task.id), lambda: broker.claim("q", 1, TTL), broker.counts):
        with pytest.raises(BrokerError):
            call()
    assert broker.wait_for_work(["q"], 5) is False


def test_wait_for_work_wakes_when_a_delayed_task_falls_due_on_the_system_clock() -> None:
    broker = MemoryBroker()
    broker.enqueue([_task(delay=timedelta(milliseconds=50))])
    started = time.monotonic()
    assert broker.wait_for_work(["q"], 10) is True
    assert time.monotonic() - started < 5


def test_a_snapshot_never_changes_after_it_was_taken() -> None:
    broker = MemoryBroker(clock=ManualClock())
    (task,) = broker.enqueue([_task()])
    (lease,) = broker.claim("q", 1, TTL)
    broker.ack(task.id, lease.token, b"r")
    assert (task.status, lease.task.status) == (Status.PENDING, Status.RUNNING)


def test_claim_after_many_cancels_skips_their_stale_heap_entries() -> None:
    broker = MemoryBroker(clock=ManualClock())
    tasks = broker.enqueue([_task() for _ in range(2000)])
    for task in tasks[:-1]:
        broker.cancel(task.id)
    (lease,) = broker.claim("q", 5, TTL)
    assert lease.task.id == tasks[-1].id
    assert broker.claim("q", 5, TTL) == []


def test_a_retry_pushes_a_fresh_heap_entry_and_the_old_one_is_ignored() -> None:
    clock = ManualClock()
    broker = MemoryBroker(clock=clock)
    broker.enqueue([_task()])
    for _ in range(3):
        (lease,) = broker.claim("q", 1, TTL)
        broker.requeue(lease.task.id, lease.token)
    assert len(broker.claim("q", 10, TTL)) == 1


def test_quota_grants_nothing_when_the_clock_steps_back_into_a_forgotten_window() -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    broker = MemoryBroker(clock=clock)
    old = broker.reserve_quota("k", 5, timedelta(minutes=1))
    clock.advance(60)
    broker.reserve_quota("k", 5, timedelta(minutes=1))
    # A wall clock stepping back into the forgotten window: its count is unknown, so 0.
    book = broker._quota
    assert book.reserve("k", 5, timedelta(minutes=1), 1, old.window_start).granted == 0


def test_release_of_more_units_than_granted_is_refused() -> None:
    broker = MemoryBroker(clock=ManualClock())
    grant = broker.reserve_quota("k", 5, timedelta(minutes=1), 2)
    with pytest.raises(ValueError):
        broker.release_quota(grant, 3)
    with pytest.raises(TypeError):
        broker.release_quota(("k", 1), 1)  # type: ignore[arg-type]
    forged = QuotaGrant("k", grant.window_start, grant.window_end, 5, 5)
    broker.release_quota(forged, 5)
    assert broker.reserve_quota("k", 5, timedelta(minutes=1), 9).granted == 5


@pytest.mark.parametrize(
    ("now", "period", "start"),
    [
        (datetime(2030, 1, 1, 13, 5, tzinfo=UTC), timedelta(hours=24), datetime(2030, 1, 1, tzinfo=UTC)),
        (datetime(2030, 1, 1, 0, 0, 59, tzinfo=UTC), timedelta(minutes=1), datetime(2030, 1, 1, tzinfo=UTC)),
        (
            datetime(2030, 1, 1, 0, 1, tzinfo=UTC),
            timedelta(minutes=1),
            datetime(2030, 1, 1, 0, 1, tzinfo=UTC),
        ),
        (
            datetime(1970, 1, 1, 0, 0, 7, tzinfo=UTC),
            timedelta(seconds=3),
            datetime(1970, 1, 1, 0, 0, 6, tzinfo=UTC),
        ),
    ],
)
def test_quota_windows_are_aligned_to_the_unix_epoch(
    now: datetime, period: timedelta, start: datetime
) -> None:
    assert window_bounds(now, period) == (start, start + period)


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.enqueue(_task()),
        lambda b: b.enqueue(["not a task"]),
        lambda b: b.wait_for_work("q", 1),
        lambda b: b.claim("q", True, TTL),
        lambda b: b.list({"type": "t"}),
        lambda b: b.ack("x", "token", "not bytes"),
        lambda b: b.claim("q", 1, 30),
    ],
)
def test_wrongly_typed_arguments_raise_type_error(call: object) -> None:
    broker = MemoryBroker(clock=ManualClock())
    with pytest.raises(TypeError):
        call(broker)  # type: ignore[operator]
    assert broker.list(Filter()) == []


def test_snapshots_hold_exactly_the_task_fields_and_never_change_afterwards() -> None:
    # A snapshot is a copy of the record's field dict: bookkeeping (token, lease end, heap
    # sequence) must stay out of it, and later transitions must not reach earlier copies.
    clock = ManualClock()
    broker = MemoryBroker(clock=clock)
    (parent,) = broker.enqueue([NewTask(id="p", type="t", queue="q", payload=b"x")])
    (child,) = broker.enqueue([NewTask(id="c", type="t", queue="q", depends_on=("p",))])
    (lease,) = broker.claim("q", 1, TTL)
    broker.heartbeat("p", lease.token, TTL)
    retried = broker.retry("p", lease.token, kind=FailureKind.BUSINESS, error="boom", delay=timedelta(0))
    (again,) = broker.claim("q", 1, TTL)
    done = broker.ack("p", again.token, b"r")
    (child_lease,) = broker.claim("q", 1, TTL)
    clock.advance(TTL)
    (reaped,) = broker.reap(lease_lost_max=3)

    snapshots = [parent, child, lease.task, retried, again.task, done, child_lease.task, reaped]
    for task in snapshots:
        assert set(vars(task)) == set(TASK_FIELDS)
    assert [t.status for t in snapshots] == [
        Status.PENDING,
        Status.BLOCKED,
        Status.RUNNING,
        Status.RETRYING,
        Status.RUNNING,
        Status.COMPLETED,
        Status.RUNNING,
        Status.PENDING,
    ]
    assert (retried.attempts, retried.last_error, done.result, done.attempts) == (1, "boom", b"r", 1)
    assert (reaped.id, reaped.lease_lost, child_lease.task.lease_lost) == ("c", 1, 0)


def test_a_pending_task_costs_the_broker_a_few_hundred_bytes() -> None:
    # The records' field dicts share their keys (see Record): with a dict of its own per
    # record the broker holds about 680 bytes a pending task here, with shared keys 480 (the
    # task's id string, its ready-heap entry and indexes included).
    broker = MemoryBroker(clock=ManualClock())
    items = [NewTask(id=f"task-{n:08d}", type="t", queue="q") for n in range(20_000)]
    tracemalloc.start()
    try:
        broker.enqueue(items)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_task = held / len(items)
    assert per_task < 560, f"{per_task:.0f} bytes per pending task"
    assert broker.counts() == {"t": {Status.PENDING: len(items)}}
