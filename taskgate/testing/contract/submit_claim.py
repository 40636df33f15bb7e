"""Contract: `SubmitClaimer.enqueue_and_claim`, for brokers declaring ``claim_on_submit``.

Not part of `BrokerContract`: a broker without the capability has nothing to test here. Add
`SubmitClaimContract` to the test class of a broker that declares it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import cast

import pytest

from taskgate.brokers.base import Broker, Lease, SubmitClaimer
from taskgate.clock import ManualClock
from taskgate.errors import TaskExistsError, TaskNotFoundError
from taskgate.task import Status
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import RACE_ROUNDS, TTL, new_task, race, submit

__all__ = ["SubmitClaimContract"]


def _claimer(broker: Broker) -> SubmitClaimer:
    assert broker.capabilities.claim_on_submit, "SubmitClaimContract is for brokers with claim_on_submit"
    return cast(SubmitClaimer, broker)


class SubmitClaimContract:
    """A submit that claims its own task in the same step, and only when nothing waits longer."""

    def test_a_task_alone_in_its_queue_is_stored_and_leased_at_once(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        item = new_task(payload=b"p")
        stored, lease = _claimer(broker).enqueue_and_claim(item, TTL)
        assert (stored.id, stored.status, stored.claims, stored.payload) == (item.id, Status.PENDING, 0, b"p")
        assert lease is not None and lease.task.id == item.id
        assert (lease.task.status, lease.task.claims, lease.task.started_at) == (
            Status.RUNNING,
            1,
            clock.now(),
        )
        assert lease.expires_at == clock.now() + TTL
        assert broker.get(item.id) == lease.task
        assert broker.claim("q", 5, TTL) == []
        done = broker.ack(item.id, lease.token, b"r")
        assert (done.status, done.result, done.claims) == (Status.COMPLETED, b"r", 1)

    def test_a_task_is_not_leased_while_another_of_its_queue_is_due(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        older = submit(broker)
        clock.advance(1)
        stored, lease = _claimer(broker).enqueue_and_claim(new_task(), TTL)
        assert lease is None
        assert broker.get(stored.id) == stored and stored.status is Status.PENDING
        assert [lease.task.id for lease in broker.claim("q", 5, TTL)] == [older.id, stored.id]

    def test_tasks_that_are_not_due_or_of_another_queue_do_not_hold_it_back(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        submit(broker, delay=timedelta(seconds=10))
        submit(broker, queue="other")
        running = submit(broker)
        claimed = broker.claim("q", 1, TTL)
        assert [lease.task.id for lease in claimed] == [running.id]
        _, lease = _claimer(broker).enqueue_and_claim(new_task(), TTL)
        assert lease is not None

    def test_a_task_not_due_on_arrival_is_stored_pending(self, broker: Broker, clock: ManualClock) -> None:
        delayed, lease = _claimer(broker).enqueue_and_claim(new_task(delay=timedelta(seconds=5)), TTL)
        assert lease is None and delayed.status is Status.PENDING
        later, lease = _claimer(broker).enqueue_and_claim(
            new_task(run_at=clock.now() + timedelta(seconds=9)), TTL
        )
        assert lease is None and later.status is Status.PENDING
        clock.advance(10)
        assert [lease.task.id for lease in broker.claim("q", 5, TTL)] == [delayed.id, later.id]

    def test_a_child_waiting_for_its_parent_is_stored_blocked(self, broker: Broker) -> None:
        parent = submit(broker, queue="parents")
        child, lease = _claimer(broker).enqueue_and_claim(new_task(depends_on=(parent.id,)), TTL)
        assert lease is None and child.status is Status.BLOCKED
        assert broker.get(child.id).status is Status.BLOCKED

    def test_a_used_business_key_stores_and_claims_nothing(self, broker: Broker) -> None:
        first, lease = _claimer(broker).enqueue_and_claim(new_task(business_key="order-1"), TTL)
        assert lease is not None and broker.history("order-1") == [lease.task]
        second = new_task(business_key="order-1")
        with pytest.raises(TaskExistsError) as raised:
            _claimer(broker).enqueue_and_claim(second, TTL)
        assert raised.value.execution_id == first.id
        with pytest.raises(TaskNotFoundError):
            broker.get(second.id)
        assert broker.get(first.id).claims == 1

    def test_an_id_in_use_is_refused_and_changes_nothing(self, broker: Broker) -> None:
        taken = submit(broker)
        with pytest.raises(ValueError, match=taken.id):
            _claimer(broker).enqueue_and_claim(new_task(id=taken.id), TTL)
        assert broker.get(taken.id) == taken

    def test_a_bad_lease_ttl_is_refused_before_anything_is_stored(self, broker: Broker) -> None:
        item = new_task()
        with pytest.raises(ValueError, match="lease_ttl"):
            _claimer(broker).enqueue_and_claim(item, timedelta(0))
        with pytest.raises(TaskNotFoundError):
            broker.get(item.id)

    def test_a_task_leased_at_once_answers_a_cancel_like_any_claimed_one(self, broker: Broker) -> None:
        item = new_task()
        _, lease = _claimer(broker).enqueue_and_claim(item, TTL)
        assert lease is not None
        assert broker.cancel(item.id).status is Status.RUNNING
        assert broker.heartbeat(item.id, lease.token, TTL).cancel_requested
        assert broker.finish_canceled(item.id, lease.token).status is Status.CANCELED

    def test_racing_submitters_and_a_claimer_lease_each_task_once(
        self, broker_factory: BrokerFactory
    ) -> None:
        for _ in range(RACE_ROUNDS):
            submitters, claimer = [broker_factory(), broker_factory()], broker_factory()
            items = [new_task(), new_task()]

            def submit_claiming(n: int) -> Lease | None:
                return _claimer(submitters[n]).enqueue_and_claim(items[n], TTL)[1]  # noqa: B023 (run at once)

            outcomes = race(
                [
                    lambda: submit_claiming(0),
                    lambda: submit_claiming(1),
                    lambda: next(iter(claimer.claim("q", 1, TTL)), None),  # noqa: B023 (run at once)
                ]
            )
            assert all(outcome.ok for outcome in outcomes), [o.error for o in outcomes]
            leased = [o.value.task.id for o in outcomes if o.value is not None]
            leased += [lease.task.id for lease in claimer.claim("q", 2, TTL)]
            assert sorted(leased) == sorted(item.id for item in items)
            assert all(claimer.get(item.id).claims == 1 for item in items)
