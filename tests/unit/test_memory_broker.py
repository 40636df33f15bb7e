"""MemoryBroker behaviour beyond the contract suite: lifecycle, real-clock waits, internals' limits."""

from __future__ import annotations

import dataclasses
import time
import tracemalloc
from datetime import UTC, datetime, timedelta

import pytest

from taskgate.brokers.base import Broker, Capabilities, FailureKind, NewTask, QuotaSpec
from taskgate.brokers.memory import MemoryBroker
from taskgate.brokers.memory._quota import window_bounds
from taskgate.brokers.params import (
    Canceled,
    Claim,
    Complete,
    Fail,
    GiveBack,
    Requeue,
    Retry,
    Settle,
    Submit,
    Submitted,
)
from taskgate.clock import ManualClock
from taskgate.errors import BrokerError, LeaseLostError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import TASK_FIELDS, Filter, Status, Task
from taskgate.testing import steps
from taskgate.testing.contract.surface import RETIRED

TTL = timedelta(seconds=30)
MINUTELY = QuotaSpec("k", 5, timedelta(minutes=1))


def _task(**fields: object) -> NewTask:
    return NewTask(id=new_id(), type="t", queue="q", **fields)  # type: ignore[arg-type]


def test_memory_broker_satisfies_the_broker_protocol() -> None:
    broker = MemoryBroker()
    assert isinstance(broker, Broker)
    assert broker.capabilities.shared_quota is True
    assert broker.capabilities.cross_process is False


def test_without_a_clock_the_system_clock_stamps_tasks() -> None:
    before = datetime.now(UTC)
    (task,) = steps.enqueue(MemoryBroker(), [_task()])
    assert before <= task.created_at <= datetime.now(UTC)


def test_every_call_after_close_raises_broker_error() -> None:
    broker = MemoryBroker()
    (task,) = steps.enqueue(broker, [_task()])
    broker.close()
    broker.close()
    for call in (lambda: broker.get(task.id), lambda: steps.claim(broker, "q", 1, TTL), broker.counts):
        with pytest.raises(BrokerError):
            call()
    assert broker.wait_for_work(["q"], 5) is False


def test_wait_for_work_wakes_when_a_delayed_task_falls_due_on_the_system_clock() -> None:
    broker = MemoryBroker()
    steps.enqueue(broker, [_task(delay=timedelta(milliseconds=50))])
    started = time.monotonic()
    assert broker.wait_for_work(["q"], 10) is True
    assert time.monotonic() - started < 5


def test_a_snapshot_never_changes_after_it_was_taken() -> None:
    broker = MemoryBroker(clock=ManualClock())
    (task,) = steps.enqueue(broker, [_task()])
    (lease,) = steps.claim(broker, "q", 1, TTL)
    steps.ack(broker, task.id, lease.token, b"r")
    assert (task.status, lease.task.status) == (Status.PENDING, Status.RUNNING)


def test_claim_after_many_cancels_skips_their_stale_heap_entries() -> None:
    broker = MemoryBroker(clock=ManualClock())
    tasks = steps.enqueue(broker, [_task() for _ in range(2000)])
    for task in tasks[:-1]:
        broker.cancel(task.id)
    (lease,) = steps.claim(broker, "q", 5, TTL)
    assert lease.task.id == tasks[-1].id
    assert steps.claim(broker, "q", 5, TTL) == []


def test_a_retry_pushes_a_fresh_heap_entry_and_the_old_one_is_ignored() -> None:
    clock = ManualClock()
    broker = MemoryBroker(clock=clock)
    steps.enqueue(broker, [_task()])
    for _ in range(3):
        (lease,) = steps.claim(broker, "q", 1, TTL)
        steps.requeue(broker, lease.task.id, lease.token)
    assert len(steps.claim(broker, "q", 10, TTL)) == 1


def test_quota_grants_nothing_when_the_clock_steps_back_into_a_forgotten_window() -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    broker = MemoryBroker(clock=clock)
    old = broker.claim(Claim("q", 1, TTL, quota=MINUTELY)).quota
    clock.advance(60)
    broker.claim(Claim("q", 1, TTL, quota=MINUTELY))
    # A wall clock stepping back into the forgotten window: its count is unknown, so 0.
    assert old is not None
    book = broker._quota
    assert book.reserve("k", 5, timedelta(minutes=1), 1, old.window_start).granted == 0


def test_units_given_back_beyond_those_used_leave_the_window_at_zero() -> None:
    broker = MemoryBroker(clock=ManualClock())
    steps.enqueue(broker, [_task(), _task()])
    grant = broker.claim(Claim("q", 2, TTL, quota=MINUTELY)).quota
    assert grant is not None and grant.granted == 2
    forged = dataclasses.replace(grant, granted=5)
    assert broker.settle(Settle(give_back=GiveBack(quota=((forged, 5),)))) == []
    steps.enqueue(broker, [_task() for _ in range(9)])
    claimed = broker.claim(Claim("q", 9, TTL, quota=MINUTELY))
    assert (len(claimed.leases), claimed.quota) == (5, dataclasses.replace(grant, granted=5))


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
        lambda b: b.submit(Submit(_task())),  # type: ignore[arg-type]
        lambda b: b.submit(Submit(["not a task"])),  # type: ignore[arg-type]
        lambda b: b.wait_for_work("q", 1),
        lambda b: b.claim(Claim("q", True, TTL)),
        lambda b: b.list({"type": "t"}),
        lambda b: b.settle(Settle((Complete("x", "token", "not bytes"),))),  # type: ignore[arg-type]
        lambda b: b.claim(Claim("q", 1, 30)),  # type: ignore[arg-type]
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
    (parent,) = steps.enqueue(broker, [NewTask(id="p", type="t", queue="q", payload=b"x")])
    (child,) = steps.enqueue(broker, [NewTask(id="c", type="t", queue="q", depends_on=("p",))])
    (lease,) = steps.claim(broker, "q", 1, TTL)
    steps.heartbeat(broker, "p", lease.token, TTL)
    retried = steps.retry(
        broker, "p", lease.token, kind=FailureKind.BUSINESS, error="boom", delay=timedelta(0)
    )
    (again,) = steps.claim(broker, "q", 1, TTL)
    done = steps.ack(broker, "p", again.token, b"r")
    (child_lease,) = steps.claim(broker, "q", 1, TTL)
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
        steps.enqueue(broker, items)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_task = held / len(items)
    assert per_task < 560, f"{per_task:.0f} bytes per pending task"
    assert broker.counts() == {"t": {Status.PENDING: len(items)}}


# -- the verbs' memory-specific answers -------------------------------------------------------


def test_the_broker_declares_what_it_honours_and_has_no_retired_method() -> None:
    broker = MemoryBroker()
    assert broker.capabilities == Capabilities(
        shared_quota=True, shared_limits=True, group_limits=True, nonblocking=True
    )
    assert [name for name in RETIRED if hasattr(broker, name)] == []


def test_settle_answers_each_item_on_its_own_in_one_call() -> None:
    clock = ManualClock()
    broker = MemoryBroker(clock=clock)
    steps.enqueue(broker, [NewTask(id=f"t{n}", type="t", queue="q") for n in range(5)])
    leases = {lease.task.id: lease for lease in steps.claim(broker, "q", 5, TTL)}
    token = {task_id: lease.token for task_id, lease in leases.items()}
    answers = broker.settle(
        Settle(
            (
                Complete("t0", token["t0"], b"r"),
                Retry("t1", "stale", FailureKind.BUSINESS, "boom"),
                Retry("t1", token["t1"], FailureKind.THROTTLED, "busy", timedelta(seconds=5)),
                Fail("t2", token["t2"], FailureKind.BUSINESS, "bad"),
                Requeue("t3", token["t3"]),
                Canceled("t4", token["t4"]),
                Complete("t4", token["t4"]),
                Complete("missing", "x"),
            )
        )
    )
    assert isinstance(answers[1], LeaseLostError)
    assert isinstance(answers[6], LeaseLostError)  # the lease was settled by the item before
    assert isinstance(answers[7], TaskNotFoundError)
    done = [a for n, a in enumerate(answers) if n not in (1, 6, 7)]
    assert done == [broker.get(f"t{n}") for n in range(5)]
    assert [(t.status, t.attempts, t.throttled) for t in done if isinstance(t, Task)] == [
        (Status.COMPLETED, 0, 0),
        (Status.RETRYING, 0, 1),
        (Status.FAILED, 1, 0),
        (Status.PENDING, 0, 0),
        (Status.CANCELED, 0, 0),
    ]


def test_settle_without_snapshots_answers_none_for_items_that_took_effect() -> None:
    broker = MemoryBroker(clock=ManualClock())
    steps.enqueue(broker, [_task(), _task()])
    first, second = steps.claim(broker, "q", 2, TTL)
    answers = broker.settle(
        Settle(
            (
                Complete(first.task.id, first.token),
                Requeue(second.task.id, "stale"),
                Requeue(second.task.id, second.token),
            ),
            snapshots=False,
        )
    )
    assert answers[0] is None and isinstance(answers[1], LeaseLostError) and answers[2] is None
    assert broker.get(first.task.id).status is Status.COMPLETED
    assert broker.get(second.task.id).status is Status.PENDING


def test_a_claim_writes_its_acks_first_and_leases_the_child_they_woke() -> None:
    broker = MemoryBroker(clock=ManualClock())
    reported: list[list[Task]] = []
    broker.report_settled(reported.append)
    steps.enqueue(
        broker,
        [NewTask(id="p", type="t", queue="q"), NewTask(id="c", type="t", queue="q", depends_on=("p",))],
    )
    (lease,) = steps.claim(broker, "q", 5, TTL)
    claimed = broker.claim(
        Claim("q", 5, TTL, acks=(Complete("p", lease.token, b"r"), Complete("p", lease.token)))
    )
    assert claimed.acked[0] is None and isinstance(claimed.acked[1], LeaseLostError)
    assert [lease.task.id for lease in claimed.leases] == ["c"]
    assert broker.get("p").result == b"r"
    assert [[t.id for t in call] for call in reported] == [["c"]]
    assert reported[0][0].status is Status.PENDING  # as the ack left it, before the claim


def test_a_quota_claim_spends_units_only_for_tasks_leased_and_says_when_none_are_left() -> None:
    broker = MemoryBroker(clock=ManualClock(datetime(2030, 1, 1, tzinfo=UTC)))
    steps.enqueue(broker, [_task() for _ in range(3)])
    first = broker.claim(Claim("q", 10, TTL, quota=MINUTELY))
    assert first.quota is not None
    assert (len(first.leases), first.quota.granted, first.exhausted) == (3, 3, False)
    assert (first.quota.window_start, first.quota.window_end) == window_bounds(
        first.quota.window_start, MINUTELY.period
    )
    steps.enqueue(broker, [_task() for _ in range(3)])
    second = broker.claim(Claim("q", 10, TTL, quota=MINUTELY))
    assert second.quota is not None
    assert (len(second.leases), second.quota.granted, second.exhausted) == (2, 2, False)
    third = broker.claim(Claim("q", 10, TTL, quota=MINUTELY))
    assert third.quota is not None
    assert (third.leases, third.quota.granted, third.exhausted) == ([], 0, True)


def test_submit_without_snapshots_answers_only_statuses() -> None:
    broker = MemoryBroker(clock=ManualClock())
    parent = NewTask(id="p", type="t", queue="q")
    quiet = broker.submit(
        Submit((parent, NewTask(id="c", type="t", queue="q", depends_on=("p",))), snapshots=False)
    )
    assert quiet == Submitted([Status.PENDING, Status.BLOCKED])
    loud = broker.submit(Submit((NewTask(id="x", type="t", queue="q"),)))
    assert loud == Submitted([Status.PENDING], [broker.get("x")])


def test_a_business_keys_executions_are_listed_in_replay_order_when_their_times_tie() -> None:
    broker = MemoryBroker(clock=ManualClock())  # a clock that never moves: every created_at ties
    steps.enqueue(broker, [NewTask(id="z", type="t", queue="q", business_key="k")])
    broker.cancel("z")
    steps.replay(broker, "z", new_id="a")
    assert [t.id for t in broker.list(Filter(business_key="k"))] == ["z", "a"]
    assert [t.id for t in broker.list(Filter(business_key="k", offset=1))] == ["a"]
