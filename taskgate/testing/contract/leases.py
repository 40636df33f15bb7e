"""Contract: heartbeats, reaping, and tokens -- every worker write is fenced by its lease."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.brokers.params import Heartbeat
from taskgate.clock import ManualClock
from taskgate.errors import LeaseLostError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Status
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, claim_one, submit

__all__ = ["LeaseContract"]

# One worker write per entry, called as write(broker, task_id, token).
WorkerWrite = Callable[[Broker, str, str], object]
WORKER_WRITES: dict[str, WorkerWrite] = {
    "ack": lambda b, i, t: steps.ack(b, i, t, b"late"),
    "fail": lambda b, i, t: steps.fail(b, i, t, kind=FailureKind.BUSINESS, error="late"),
    "retry": lambda b, i, t: steps.retry(
        b, i, t, kind=FailureKind.BUSINESS, error="late", delay=timedelta(0)
    ),
    "requeue": lambda b, i, t: steps.requeue(b, i, t),
    "finish_canceled": lambda b, i, t: steps.finish_canceled(b, i, t),
    "heartbeat": lambda b, i, t: steps.heartbeat(b, i, t, TTL),
}
WRITE_NAMES = sorted(WORKER_WRITES)


class LeaseContract:
    """Leases (seed: LeaseReap, StaleToken, IllegalTransition)."""

    def test_heartbeat_extends_the_lease_from_now(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        clock.advance(TTL - timedelta(seconds=1))
        renewal = steps.heartbeat(broker, task.id, lease.token, TTL)
        assert renewal.expires_at == clock.now() + TTL
        clock.advance(TTL - timedelta(seconds=1))
        assert broker.reap(lease_lost_max=3) == []
        assert broker.get(task.id).status is Status.RUNNING

    def test_heartbeat_without_a_slot_queue_answers_no_slot_lost(self, broker: Broker) -> None:
        task = submit(broker)
        renewal = broker.heartbeat(Heartbeat(task.id, claim_one(broker).token, TTL))
        assert (renewal.cancel_requested, renewal.slot_lost) == (False, False)

    def test_reap_leaves_a_live_lease_alone(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        claim_one(broker)
        clock.advance(TTL - timedelta(seconds=1))
        assert broker.reap(lease_lost_max=3) == []
        assert broker.get(task.id).status is Status.RUNNING

    def test_reap_takes_back_a_lease_at_its_expiry(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        claim_one(broker)
        clock.advance(TTL)
        (reaped,) = broker.reap(lease_lost_max=3)
        assert (reaped.id, reaped.status, reaped.lease_lost) == (task.id, Status.PENDING, 1)
        assert (reaped.attempts, reaped.throttled, reaped.claims) == (0, 0, 1)
        assert reaped.run_at <= clock.now()
        assert broker.get(task.id) == reaped

    def test_reaped_task_is_claimed_again(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        first = claim_one(broker)
        clock.advance(TTL)
        broker.reap(lease_lost_max=3)
        second = claim_one(broker)
        assert (second.task.id, second.task.claims, second.task.lease_lost) == (task.id, 2, 1)
        assert second.token != first.token

    def test_reap_fails_the_task_at_lease_lost_max(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        child = submit(broker, queue="children", depends_on=(task.id,))
        for _ in range(2):
            claim_one(broker)
            clock.advance(TTL)
            (reaped,) = broker.reap(lease_lost_max=2)
        assert (reaped.status, reaped.lease_lost, reaped.attempts) == (Status.FAILED, 2, 0)
        assert reaped.finished_at == clock.now()
        assert broker.get(child.id).status is Status.CANCELED

    def test_reap_takes_at_most_its_limit(self, broker: Broker, clock: ManualClock) -> None:
        for _ in range(3):
            submit(broker)
        steps.claim(broker, "q", 3, TTL)
        clock.advance(TTL)
        assert len(broker.reap(lease_lost_max=3, limit=2)) == 2
        assert len(broker.reap(lease_lost_max=3, limit=2)) == 1
        assert broker.reap(lease_lost_max=3, limit=2) == []

    def test_reap_ignores_tasks_that_hold_no_lease(self, broker: Broker, clock: ManualClock) -> None:
        submit(broker)
        submit(broker, delay=timedelta(seconds=1))
        task = submit(broker, queue="r")
        steps.retry(
            broker, task.id, claim_one(broker, "r").token, kind=FailureKind.BUSINESS, error="x", delay=TTL
        )
        clock.advance(TTL * 10)
        assert broker.reap(lease_lost_max=1) == []

    def test_expired_lease_not_yet_reaped_can_still_be_renewed(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        clock.advance(TTL * 2)
        assert steps.heartbeat(broker, task.id, lease.token, TTL).expires_at == clock.now() + TTL
        assert broker.reap(lease_lost_max=3) == []

    def test_expired_lease_not_yet_reaped_can_still_ack(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        clock.advance(TTL * 2)
        assert steps.ack(broker, task.id, lease.token, None).status is Status.COMPLETED
        assert broker.reap(lease_lost_max=3) == []

    @pytest.mark.parametrize("write", WRITE_NAMES)
    def test_write_with_a_wrong_token_raises_lease_lost_and_changes_nothing(
        self, broker: Broker, write: str
    ) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        before = broker.get(task.id)
        with pytest.raises(LeaseLostError):
            WORKER_WRITES[write](broker, task.id, lease.token + "-forged")
        assert broker.get(task.id) == before
        assert steps.heartbeat(broker, task.id, lease.token, TTL).cancel_requested is False

    @pytest.mark.parametrize("write", WRITE_NAMES)
    def test_write_with_a_reaped_token_raises_lease_lost_and_changes_nothing(
        self, broker: Broker, clock: ManualClock, write: str
    ) -> None:
        task = submit(broker)
        stale = claim_one(broker)
        clock.advance(TTL)
        broker.reap(lease_lost_max=3)
        before = broker.get(task.id)
        with pytest.raises(LeaseLostError):
            WORKER_WRITES[write](broker, task.id, stale.token)
        assert broker.get(task.id) == before

    @pytest.mark.parametrize("write", WRITE_NAMES)
    def test_write_with_the_token_of_an_earlier_claim_raises_lease_lost(
        self, broker: Broker, clock: ManualClock, write: str
    ) -> None:
        task = submit(broker)
        stale = claim_one(broker)
        clock.advance(TTL)
        broker.reap(lease_lost_max=3)
        current = claim_one(broker)
        before = broker.get(task.id)
        with pytest.raises(LeaseLostError):
            WORKER_WRITES[write](broker, task.id, stale.token)
        assert broker.get(task.id) == before
        assert steps.ack(broker, task.id, current.token, b"new").result == b"new"

    @pytest.mark.parametrize("write", WRITE_NAMES)
    def test_write_after_the_task_is_final_raises_lease_lost(self, broker: Broker, write: str) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        done = steps.ack(broker, task.id, lease.token, b"first")
        with pytest.raises(LeaseLostError):
            WORKER_WRITES[write](broker, task.id, lease.token)
        assert broker.get(task.id) == done

    @pytest.mark.parametrize("write", WRITE_NAMES)
    def test_write_on_a_task_never_claimed_raises_lease_lost(self, broker: Broker, write: str) -> None:
        task = submit(broker)
        with pytest.raises(LeaseLostError):
            WORKER_WRITES[write](broker, task.id, "no-such-token")
        assert broker.get(task.id) == task

    @pytest.mark.parametrize("write", WRITE_NAMES)
    def test_write_on_an_unknown_task_raises_task_not_found(self, broker: Broker, write: str) -> None:
        with pytest.raises(TaskNotFoundError):
            WORKER_WRITES[write](broker, new_id(), "no-such-token")

    def test_reap_rejects_a_lease_lost_max_below_one(self, broker: Broker) -> None:
        with pytest.raises(ValueError):
            broker.reap(lease_lost_max=0)
