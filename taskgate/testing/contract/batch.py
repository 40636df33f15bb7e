"""Contract: `Broker.ack_many`, many acks in one unit with one independent answer per item."""

from __future__ import annotations

import pytest

from taskgate.brokers.base import Broker
from taskgate.clock import ManualClock
from taskgate.errors import LeaseLostError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Status, Task
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import (
    BAD_ACK_ITEMS,
    RACE_ROUNDS,
    TTL,
    ack_item,
    claim_many,
    claim_one,
    nonzero_counts,
    race,
    submit,
)

__all__ = ["BatchContract"]

PARENTS = "parents"


class BatchContract:
    """Batched acks (issue "Performance"): per-item answers, never all-or-nothing."""

    def test_ack_many_of_no_items_returns_an_empty_list(self, broker: Broker) -> None:
        assert broker.ack_many([]) == []

    def test_ack_many_completes_every_held_task_with_its_own_result(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        leases = claim_many(broker, 3)
        answers = broker.ack_many([ack_item(lease, f"r{n}".encode()) for n, lease in enumerate(leases)])
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

    def test_ack_many_mixes_results_and_none(self, broker: Broker) -> None:
        first, second = claim_many(broker, 2)
        broker.ack_many([ack_item(first, None), ack_item(second, b"\x00bytes")])
        assert broker.get(first.task.id).result is None
        assert broker.get(second.task.id).result == b"\x00bytes"

    def test_ack_many_answers_stale_and_unknown_items_alone(self, broker: Broker) -> None:
        good, stale, later = claim_many(broker, 3)
        unknown = new_id()
        answers = broker.ack_many(
            [ack_item(good), (stale.task.id, "not-the-token", b"x"), ack_item(later), (unknown, "t", None)]
        )
        assert isinstance(answers[0], Task) and answers[0].status is Status.COMPLETED
        assert isinstance(answers[1], LeaseLostError)
        assert isinstance(answers[2], Task) and answers[2].status is Status.COMPLETED
        assert isinstance(answers[3], TaskNotFoundError)
        untouched = broker.get(stale.task.id)
        assert (untouched.status, untouched.result) == (Status.RUNNING, None)
        assert broker.ack(stale.task.id, stale.token, b"late").result == b"late"

    def test_ack_many_of_a_reaped_lease_answers_lease_lost_and_changes_nothing(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        (lease,) = claim_many(broker, 1)
        clock.advance(TTL)
        broker.reap(lease_lost_max=5)
        before = broker.get(lease.task.id)
        (answer,) = broker.ack_many([ack_item(lease, b"late")])
        assert isinstance(answer, LeaseLostError)
        assert broker.get(lease.task.id) == before
        assert before.status is Status.PENDING

    def test_ack_many_of_one_id_twice_acks_it_once(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1)
        first, second = broker.ack_many([ack_item(lease, b"one"), ack_item(lease, b"two")])
        assert isinstance(first, Task) and first.result == b"one"
        assert isinstance(second, LeaseLostError)
        assert broker.get(lease.task.id).result == b"one"
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 1}}

    def test_ack_many_of_one_id_stale_then_held_completes_it_with_the_held_items_result(
        self, broker: Broker
    ) -> None:
        (lease,) = claim_many(broker, 1)
        stale, held = broker.ack_many([(lease.task.id, "stale", b"wrong"), ack_item(lease, b"right")])
        assert isinstance(stale, LeaseLostError)
        assert isinstance(held, Task) and held.result == b"right"
        assert broker.get(lease.task.id).result == b"right"

    def test_ack_many_completes_a_task_marked_for_cancel(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1)
        broker.cancel(lease.task.id)
        (answer,) = broker.ack_many([ack_item(lease, b"done")])
        assert isinstance(answer, Task) and answer.status is Status.COMPLETED
        assert answer.result == b"done"

    def test_ack_many_wakes_the_children_of_every_parent(self, broker: Broker) -> None:
        one, two, held = claim_many(broker, 3, queue=PARENTS)
        only_one = submit(broker, depends_on=(one.task.id,))
        both = submit(broker, depends_on=(one.task.id, two.task.id))
        with_held = submit(broker, depends_on=(two.task.id, held.task.id))
        grandchild = submit(broker, depends_on=(both.id,))
        broker.ack_many([ack_item(one), ack_item(two), (held.task.id, "stale", None)])
        assert broker.get(only_one.id).status is Status.PENDING
        assert broker.get(both.id).status is Status.PENDING
        assert broker.get(with_held.id).status is Status.BLOCKED
        assert broker.get(grandchild.id).status is Status.BLOCKED
        assert broker.queue_length("q") == 2
        woken = {lease.task.id for lease in broker.claim("q", 10, TTL)}
        assert woken == {only_one.id, both.id}

    def test_ack_many_wakes_a_child_whose_parents_all_finish_in_the_batch(self, broker: Broker) -> None:
        first, second = claim_many(broker, 2, queue=PARENTS)
        child = submit(broker, depends_on=(first.task.id, second.task.id))
        broker.ack_many([ack_item(second), ack_item(first)])
        assert broker.get(child.id).status is Status.PENDING
        assert [lease.task.id for lease in broker.claim("q", 10, TTL)] == [child.id]

    def test_ack_many_serves_tasks_of_several_queues(self, broker: Broker) -> None:
        submit(broker, queue="q")
        submit(broker, queue="other")
        here, there = claim_one(broker, "q"), claim_one(broker, "other")
        answers = broker.ack_many([ack_item(here), ack_item(there)])
        assert [a.status for a in answers if isinstance(a, Task)] == [Status.COMPLETED] * 2

    @pytest.mark.parametrize(("bad", "error"), BAD_ACK_ITEMS)
    def test_ack_many_refuses_bad_items_before_changing_anything(
        self, broker: Broker, bad: object, error: type[Exception]
    ) -> None:
        (lease,) = claim_many(broker, 1)
        items = [ack_item(lease), *bad] if isinstance(bad, list) else bad
        with pytest.raises(error):
            broker.ack_many(items)  # type: ignore[arg-type]
        assert broker.get(lease.task.id).status is Status.RUNNING

    def test_racing_ack_many_calls_complete_each_task_exactly_once(
        self, broker_factory: BrokerFactory
    ) -> None:
        first, second = broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            leases = claim_many(first, 4)
            _race_opposite_orders(first, second, [ack_item(lease) for lease in leases])
            assert nonzero_counts(first)["t"].get(Status.RUNNING, 0) == 0


def _race_opposite_orders(first: Broker, second: Broker, items: list[tuple[str, str, bytes | None]]) -> None:
    """Ack ``items`` from two brokers at once, in opposite orders: each completes exactly once."""
    outcomes = race([lambda: first.ack_many(items), lambda: second.ack_many(items[::-1])])
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    done = [a.id for o in outcomes for a in o.value or [] if isinstance(a, Task)]
    lost = [a for o in outcomes for a in o.value or [] if isinstance(a, LeaseLostError)]
    assert sorted(done) == sorted(task_id for task_id, _, _ in items)
    assert len(lost) == len(items)
