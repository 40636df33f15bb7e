"""Contract: `Broker.settle` -- many items in one unit, each answered on its own.

Items are independent: a Complete, a Retry and a Fail in one call each take effect as they
would alone; a stale or unknown item answers its own error and changes nothing for its task.
``snapshots=False`` stores exactly the same and answers None where a snapshot would be.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from taskgate.brokers.base import Broker, FailureKind
from taskgate.brokers.params import Canceled, Complete, Fail, ItemAnswer, Requeue, Retry, Settle
from taskgate.clock import ManualClock
from taskgate.errors import LeaseLostError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import (
    RACE_ROUNDS,
    TTL,
    Outcome,
    ack_item,
    claim_many,
    claim_one,
    nonzero_counts,
    race,
    submit,
)

__all__ = ["SettleContract"]

PARENTS = "parents"
DELAY = timedelta(seconds=8)


def _settle(broker: Broker, *items: Complete | Retry | Fail | Requeue | Canceled) -> list[ItemAnswer]:
    return broker.settle(Settle(items))


def _quietly(broker: Broker, *items: Complete | Retry | Fail | Requeue | Canceled) -> list[ItemAnswer]:
    return broker.settle(Settle(items, snapshots=False))


class SettleContract:
    """Batched settles (issue "Performance"): per-item answers, never all-or-nothing."""

    def test_a_settle_of_no_items_returns_an_empty_list(self, broker: Broker) -> None:
        assert _settle(broker) == []
        assert _quietly(broker) == []

    def test_a_settle_completes_every_held_task_with_its_own_result(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        leases = claim_many(broker, 3)
        answers = _settle(broker, *(ack_item(lease, f"r{n}".encode()) for n, lease in enumerate(leases)))
        assert [a.id for a in answers if isinstance(a, Task)] == [lease.task.id for lease in leases]
        for n, answer in enumerate(answers):
            assert isinstance(answer, Task)
            assert (answer.status, answer.result, answer.finished_at) == (
                Status.COMPLETED,
                f"r{n}".encode(),
                clock.now(),
            )
            assert broker.get(answer.id) == answer
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 3}}

    def test_a_settle_mixes_results_and_none(self, broker: Broker) -> None:
        first, second = claim_many(broker, 2)
        _settle(broker, ack_item(first, None), ack_item(second, b"\x00bytes"))
        assert broker.get(first.task.id).result is None
        assert broker.get(second.task.id).result == b"\x00bytes"

    def test_a_retry_a_fail_and_a_complete_in_one_call_each_take_effect_as_alone(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        retried, failed, done, requeued = claim_many(broker, 4, queue=PARENTS)
        child_of_failed = submit(broker, depends_on=(failed.task.id,))
        child_of_done = submit(broker, depends_on=(done.task.id,))
        clock.advance(1)
        answers = _settle(
            broker,
            Retry(retried.task.id, retried.token, FailureKind.THROTTLED, "busy", DELAY),
            Fail(failed.task.id, failed.token, FailureKind.BUSINESS, "boom"),
            Complete(done.task.id, done.token, b"ok"),
            Requeue(requeued.task.id, requeued.token),
        )
        assert all(isinstance(a, Task) for a in answers)
        by_id = {a.id: a for a in answers if isinstance(a, Task)}
        assert [a.id for a in answers if isinstance(a, Task)] == [
            lease.task.id for lease in (retried, failed, done, requeued)
        ]
        again = by_id[retried.task.id]
        assert (again.status, again.throttled, again.attempts) == (Status.RETRYING, 1, 0)
        assert (again.run_at, again.last_error) == (clock.now() + DELAY, "busy")
        lost = by_id[failed.task.id]
        assert (lost.status, lost.attempts, lost.last_error) == (Status.FAILED, 1, "boom")
        assert (by_id[done.task.id].status, by_id[done.task.id].result) == (Status.COMPLETED, b"ok")
        back = by_id[requeued.task.id]
        assert (back.status, back.run_at, back.attempts) == (Status.PENDING, clock.now(), 0)
        for answer in answers:
            assert isinstance(answer, Task) and broker.get(answer.id) == answer
        assert broker.get(child_of_failed.id).status is Status.CANCELED
        assert broker.get(child_of_done.id).status is Status.PENDING
        assert claim_one(broker).task.id == child_of_done.id

    def test_a_stale_item_among_good_ones_of_every_kind_answers_alone(self, broker: Broker) -> None:
        retried, stale, failed, done = claim_many(broker, 4)
        unknown = new_id()
        answers = _settle(
            broker,
            Retry(retried.task.id, retried.token, FailureKind.BUSINESS, "x", DELAY),
            Fail(stale.task.id, "not-the-token", FailureKind.BUSINESS, "x"),
            Fail(failed.task.id, failed.token, FailureKind.SKIP, "x"),
            Requeue(unknown, "t"),
            Complete(done.task.id, done.token, b"r"),
        )
        assert [type(a) for a in answers] == [Task, LeaseLostError, Task, TaskNotFoundError, Task]
        assert isinstance(answers[3], TaskNotFoundError) and unknown in str(answers[3])
        assert [broker.get(lease.task.id).status for lease in (retried, failed, done)] == [
            Status.RETRYING,
            Status.FAILED,
            Status.COMPLETED,
        ]
        untouched = broker.get(stale.task.id)
        assert (untouched.status, untouched.attempts, untouched.last_error) == (Status.RUNNING, 0, None)
        assert steps.ack(broker, stale.task.id, stale.token, b"late").result == b"late"

    def test_a_settle_answers_stale_and_unknown_items_alone(self, broker: Broker) -> None:
        good, stale, later = claim_many(broker, 3)
        unknown = new_id()
        forged = Complete(stale.task.id, "not-the-token", b"x")
        answers = _settle(broker, ack_item(good), forged, ack_item(later), Complete(unknown, "t"))
        assert isinstance(answers[0], Task) and answers[0].status is Status.COMPLETED
        assert isinstance(answers[1], LeaseLostError)
        assert isinstance(answers[2], Task) and answers[2].status is Status.COMPLETED
        assert isinstance(answers[3], TaskNotFoundError)
        untouched = broker.get(stale.task.id)
        assert (untouched.status, untouched.result) == (Status.RUNNING, None)

    def test_a_settle_of_a_reaped_lease_answers_lease_lost_and_changes_nothing(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        (lease,) = claim_many(broker, 1)
        clock.advance(TTL)
        broker.reap(lease_lost_max=5)
        before = broker.get(lease.task.id)
        for settle in (_settle, _quietly):
            (answer,) = settle(broker, ack_item(lease, b"late"))
            assert isinstance(answer, LeaseLostError)
            assert broker.get(lease.task.id) == before
        assert before.status is Status.PENDING

    def test_a_lease_named_twice_is_settled_once_by_the_first_item(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1)
        first, second = _settle(
            broker,
            Retry(lease.task.id, lease.token, FailureKind.BUSINESS, "one", DELAY),
            ack_item(lease, b"two"),
        )
        assert isinstance(first, Task) and first.status is Status.RETRYING
        assert isinstance(second, LeaseLostError)
        assert (broker.get(lease.task.id).status, broker.get(lease.task.id).result) == (Status.RETRYING, None)

    def test_a_settle_of_one_id_twice_completes_it_once(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1)
        first, second = _settle(broker, ack_item(lease, b"one"), ack_item(lease, b"two"))
        assert isinstance(first, Task) and first.result == b"one"
        assert isinstance(second, LeaseLostError)
        assert broker.get(lease.task.id).result == b"one"
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 1}}

    def test_a_settle_of_one_id_stale_then_held_completes_it_with_the_held_items_result(
        self, broker: Broker
    ) -> None:
        (lease,) = claim_many(broker, 1)
        stale, held = _settle(broker, Complete(lease.task.id, "stale", b"wrong"), ack_item(lease, b"right"))
        assert isinstance(stale, LeaseLostError)
        assert isinstance(held, Task) and held.result == b"right"
        assert broker.get(lease.task.id).result == b"right"

    def test_a_settle_completes_a_task_marked_for_cancel(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1)
        broker.cancel(lease.task.id)
        (answer,) = _settle(broker, ack_item(lease, b"done"))
        assert isinstance(answer, Task) and answer.status is Status.COMPLETED
        assert answer.result == b"done"

    def test_a_settle_wakes_the_children_of_every_parent(self, broker: Broker) -> None:
        one, two, held = claim_many(broker, 3, queue=PARENTS)
        only_one = submit(broker, depends_on=(one.task.id,))
        both = submit(broker, depends_on=(one.task.id, two.task.id))
        with_held = submit(broker, depends_on=(two.task.id, held.task.id))
        grandchild = submit(broker, depends_on=(both.id,))
        _settle(broker, ack_item(one), ack_item(two), Complete(held.task.id, "stale"))
        assert broker.get(only_one.id).status is Status.PENDING
        assert broker.get(both.id).status is Status.PENDING
        assert broker.get(with_held.id).status is Status.BLOCKED
        assert broker.get(grandchild.id).status is Status.BLOCKED
        assert steps.queue_length(broker, "q") == 2
        woken = {lease.task.id for lease in steps.claim(broker, "q", 10, TTL)}
        assert woken == {only_one.id, both.id}

    def test_a_settle_wakes_a_child_whose_parents_all_finish_in_it(self, broker: Broker) -> None:
        first, second = claim_many(broker, 2, queue=PARENTS)
        child = submit(broker, depends_on=(first.task.id, second.task.id))
        _settle(broker, ack_item(second), ack_item(first))
        assert broker.get(child.id).status is Status.PENDING
        assert [lease.task.id for lease in steps.claim(broker, "q", 10, TTL)] == [child.id]

    def test_a_settle_serves_tasks_of_several_queues(self, broker: Broker) -> None:
        submit(broker, queue="q")
        submit(broker, queue="other")
        here, there = claim_one(broker, "q"), claim_one(broker, "other")
        answers = _settle(broker, ack_item(here), ack_item(there))
        assert [a.status for a in answers if isinstance(a, Task)] == [Status.COMPLETED] * 2

    def test_racing_settles_complete_each_task_exactly_once(self, broker_factory: BrokerFactory) -> None:
        first, second = broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            items = [ack_item(lease) for lease in claim_many(first, 4)]
            outcomes = race([lambda: _settle(first, *items), lambda: _settle(second, *items[::-1])])  # noqa: B023
            _assert_each_settled_once(outcomes, items)
            assert nonzero_counts(first)["t"].get(Status.RUNNING, 0) == 0


class QuietSettleContract:
    """``Settle(snapshots=False)``: None for what took effect, otherwise what a settle does."""

    def test_a_quiet_settle_stores_exactly_what_a_settle_stores(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        loud, quiet, loud_none, quiet_none, loud_retry, quiet_retry = claim_many(broker, 6)
        broker.cancel(quiet.task.id)  # a cancel mark does not stop a completion, and leaves no trace
        broker.cancel(loud.task.id)
        clock.advance(1)

        answers = _settle(
            broker,
            ack_item(loud, b"\x00r"),
            ack_item(loud_none),
            Retry(loud_retry.task.id, loud_retry.token, FailureKind.BUSINESS, "x", DELAY),
        )
        quiet_answers = _quietly(
            broker,
            ack_item(quiet, b"\x00r"),
            ack_item(quiet_none),
            Retry(quiet_retry.task.id, quiet_retry.token, FailureKind.BUSINESS, "x", DELAY),
        )
        assert quiet_answers == [None, None, None]
        for twin, answer in zip((quiet, quiet_none, quiet_retry), answers, strict=True):
            assert isinstance(answer, Task)
            stored = broker.get(twin.task.id)
            assert replace(stored, id=answer.id) == answer
        assert (broker.get(quiet.task.id).result, broker.get(quiet_none.task.id).result) == (b"\x00r", None)
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 4, Status.RETRYING: 2}}

    def test_a_quiet_settle_answers_stale_unknown_and_repeated_items_alone(self, broker: Broker) -> None:
        good, stale, failed = claim_many(broker, 3)
        unknown = new_id()
        answers = _quietly(
            broker,
            ack_item(good, b"1"),
            Complete(stale.task.id, "bad-token", b"x"),
            Complete(unknown, "t"),
            Fail(failed.task.id, failed.token, FailureKind.BUSINESS, "boom"),
            ack_item(good, b"2"),
        )
        assert answers[0] is None and answers[3] is None
        assert isinstance(answers[1], LeaseLostError)
        assert isinstance(answers[2], TaskNotFoundError) and unknown in str(answers[2])
        assert isinstance(answers[4], LeaseLostError)
        assert broker.get(good.task.id).result == b"1"
        assert broker.get(failed.task.id).status is Status.FAILED
        untouched = broker.get(stale.task.id)
        assert (untouched.status, untouched.result) == (Status.RUNNING, None)

    def test_a_quiet_settle_wakes_the_children_and_cancels_the_descendants(self, broker: Broker) -> None:
        one, two, three, broken = claim_many(broker, 4, queue=PARENTS)
        child = submit(broker, depends_on=(one.task.id, two.task.id))
        waiting = submit(broker, depends_on=(three.task.id,))
        doomed = submit(broker, depends_on=(broken.task.id,))
        assert _quietly(broker, ack_item(one)) == [None]
        assert broker.get(child.id).status is Status.BLOCKED
        failure = Fail(broken.task.id, broken.token, FailureKind.SKIP, "x")
        assert _quietly(broker, ack_item(two), ack_item(three), failure) == [None, None, None]
        assert {broker.get(child.id).status, broker.get(waiting.id).status} == {Status.PENDING}
        assert broker.get(doomed.id).status is Status.CANCELED
        assert {lease.task.id for lease in steps.claim(broker, "q", 10, TTL)} == {child.id, waiting.id}

    def test_a_quiet_settle_racing_a_settle_completes_each_task_exactly_once(
        self, broker_factory: BrokerFactory
    ) -> None:
        first, second = broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            items = [ack_item(lease) for lease in claim_many(first, 4)]
            outcomes = race([lambda: _quietly(first, *items), lambda: _settle(second, *items[::-1])])  # noqa: B023
            _assert_each_settled_once(outcomes, items)
            assert nonzero_counts(first)["t"].get(Status.RUNNING, 0) == 0


def _assert_each_settled_once(outcomes: list[Outcome[list[ItemAnswer]]], items: list[Complete]) -> None:
    """Two racing settles of the same ``items``: each item took effect exactly once."""
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    answers = [a for o in outcomes for a in o.value or []]
    assert sum(a is None or isinstance(a, Task) for a in answers) == len(items)
    assert sum(isinstance(a, LeaseLostError) for a in answers) == len(items)
    done = [a.id for a in answers if isinstance(a, Task)]
    assert len(done) == len(set(done)) and set(done) <= {item.task_id for item in items}
