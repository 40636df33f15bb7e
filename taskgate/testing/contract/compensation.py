"""Contract: compensation -- a final failure submits its undo task in the SAME unit.

A `Fail` carrying a `Compensation`, and a task `Broker.reap` fails at ``lease_lost_max`` whose
type ``compensations`` names, create one new task of the compensation's type and queue with
the payload ``{"failed": <id>}``, no parents, due at once -- in the transaction (lock hold,
script) that failed the task, so no crash can leave one without the other. A write that
fails nothing (a stale token, a retry, a reap below the maximum) submits nothing.
"""

from __future__ import annotations

import json
from datetime import timedelta

from taskgate.brokers.base import Broker, FailureKind
from taskgate.brokers.params import Compensation, Fail, Retry, Settle
from taskgate.clock import ManualClock
from taskgate.errors import LeaseLostError
from taskgate.task import Filter, Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, claim_many, claim_one, submit

__all__ = ["CompensationContract"]

REFUND = Compensation("refund", "undo", max_retry=2)


def _compensations(broker: Broker) -> list[Task]:
    return broker.list(Filter(type=REFUND.type))


def _fail(broker: Broker, task_id: str, token: str, compensation: Compensation | None = REFUND) -> object:
    item = Fail(task_id, token, FailureKind.BUSINESS, "ValueError: no", compensation=compensation)
    (answer,) = broker.settle(Settle((item,)))
    return answer


class CompensationContract:
    """`Fail.compensation` and `Broker.reap`'s ``compensations`` (issue 39)."""

    def test_a_failure_with_a_compensation_submits_it_due_at_once(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        (lease,) = claim_many(broker, 1)
        answer = _fail(broker, lease.task.id, lease.token)
        assert isinstance(answer, Task)
        assert (answer.id, answer.status) == (lease.task.id, Status.FAILED)
        (refund,) = _compensations(broker)
        assert (refund.type, refund.queue, refund.status, refund.max_retry) == (
            "refund",
            "undo",
            Status.PENDING,
            2,
        )
        assert json.loads(refund.payload or b"") == {"failed": lease.task.id}
        assert (refund.depends_on, refund.business_key, refund.attempts) == ((), None, 0)
        assert refund.run_at <= clock.now()
        assert refund.id != lease.task.id
        claimed = claim_one(broker, "undo")
        assert claimed.task.id == refund.id

    def test_a_compensation_wakes_its_queue(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1)
        assert not broker.wait_for_work(["undo"], 0)
        _fail(broker, lease.task.id, lease.token)
        assert broker.wait_for_work(["undo"], 0)

    def test_a_failure_without_one_submits_nothing(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1)
        _fail(broker, lease.task.id, lease.token, compensation=None)
        assert broker.list(Filter()) == [broker.get(lease.task.id)]

    def test_a_stale_token_fails_nothing_and_submits_nothing(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        (lease,) = claim_many(broker, 1)
        clock.advance(TTL + timedelta(seconds=1))
        broker.reap(lease_lost_max=5)
        answer = _fail(broker, lease.task.id, lease.token)
        assert isinstance(answer, LeaseLostError)
        assert broker.get(lease.task.id).status is Status.PENDING
        assert _compensations(broker) == []

    def test_each_failure_of_one_settle_gets_its_own_compensation(self, broker: Broker) -> None:
        first, second, retried = claim_many(broker, 3)
        items = (
            Fail(first.task.id, first.token, FailureKind.BUSINESS, "a", compensation=REFUND),
            Fail(second.task.id, second.token, FailureKind.SKIP, "b", compensation=REFUND),
            Retry(retried.task.id, retried.token, FailureKind.BUSINESS, "c"),
        )
        broker.settle(Settle(items, snapshots=False))
        failed = {json.loads(t.payload or b"")["failed"] for t in _compensations(broker)}
        assert failed == {first.task.id, second.task.id}
        assert broker.get(retried.task.id).status is Status.RETRYING

    def test_a_failure_cancels_its_children_and_still_submits_its_compensation(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1)
        child = submit(broker, depends_on=(lease.task.id,))
        _fail(broker, lease.task.id, lease.token)
        assert broker.get(child.id).status is Status.CANCELED
        assert len(_compensations(broker)) == 1

    def test_reap_at_the_maximum_submits_the_compensation_of_the_failed_type(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        compensated = submit(broker, type="charge")
        other = submit(broker, type="mail")
        claim_many_of(broker, 2)
        clock.advance(TTL + timedelta(seconds=1))
        reaped = broker.reap(lease_lost_max=1, compensations={"charge": REFUND})
        assert {t.id: t.status for t in reaped} == {compensated.id: Status.FAILED, other.id: Status.FAILED}
        (refund,) = _compensations(broker)
        assert json.loads(refund.payload or b"") == {"failed": compensated.id}
        assert (refund.status, refund.queue) == (Status.PENDING, "undo")

    def test_reap_below_the_maximum_or_of_a_cancel_submits_nothing(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        back = submit(broker, type="charge")
        canceled = submit(broker, type="charge")
        claim_many_of(broker, 2)
        broker.cancel(canceled.id)  # running: only marked
        clock.advance(TTL + timedelta(seconds=1))
        reaped = broker.reap(lease_lost_max=2, compensations={"charge": REFUND})
        assert {t.id: t.status for t in reaped} == {back.id: Status.PENDING, canceled.id: Status.CANCELED}
        assert _compensations(broker) == []

    def test_two_failures_in_one_reap_get_distinct_compensations(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        tasks = [submit(broker, type="charge") for _ in range(3)]
        claim_many_of(broker, 3)
        clock.advance(TTL + timedelta(seconds=1))
        broker.reap(lease_lost_max=1, compensations={"charge": REFUND})
        refunds = _compensations(broker)
        assert len({t.id for t in refunds}) == 3
        assert {json.loads(t.payload or b"")["failed"] for t in refunds} == {t.id for t in tasks}


def claim_many_of(broker: Broker, n: int) -> None:
    """Claim the ``n`` tasks already submitted to queue ``q``."""
    assert len(steps.claim(broker, "q", n, TTL)) == n
