"""Contract: `Broker.report_settled` -- what transitions settle on their own reaches the sink.

Every test sets a sink recording each call's list, makes one transition, and holds the lists
to the tasks as the broker stores them afterwards: the children a completion woke, the
descendants a failure, cancel or reap canceled -- never the task the call names, never an
empty list, nothing for a call that wrote nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.brokers.params import Claim, Complete, Fail, Settle
from taskgate.clock import ManualClock
from taskgate.errors import LeaseLostError
from taskgate.task import Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, ack_item, claim_one, submit

__all__ = ["SettledContract"]

PARENTS = "parents"  # parents in a queue of their own: claiming one never takes a child

# The writes that cancel a running task marked for cancel: write(broker, task_id, token).
MARKED_WRITES: dict[str, Callable[[Broker, str, str], Task]] = {
    "retry": lambda b, i, t: steps.retry(b, i, t, kind=FailureKind.BUSINESS, error="x", delay=timedelta(0)),
    "requeue": steps.requeue,
    "finish_canceled": steps.finish_canceled,
}


class _Sink:
    """Records every list a broker hands its sink."""

    def __init__(self) -> None:
        self.calls: list[list[Task]] = []

    def __call__(self, tasks: list[Task]) -> None:
        self.calls.append(list(tasks))


def _stored(broker: Broker, *tasks: Task) -> list[Task]:
    return [broker.get(task.id) for task in tasks]


def _chain(broker: Broker) -> tuple[Task, Task, Task]:
    """A parent (queue `PARENTS`), its blocked child and the child's blocked child."""
    parent = submit(broker, queue=PARENTS)
    child = submit(broker, depends_on=(parent.id,))
    grandchild = submit(broker, depends_on=(child.id,))
    return parent, child, grandchild


def _canceled_running(broker: Broker) -> tuple[str, str, Task, Task]:
    """A running parent marked for cancel (its id and token) and its two blocked descendants."""
    parent, child, grandchild = _chain(broker)
    lease = claim_one(broker, PARENTS)
    broker.cancel(parent.id)
    return parent.id, lease.token, child, grandchild


class SettledContract:
    """The sink of `Broker.report_settled` sees every task a transition settles on its own."""

    @pytest.fixture
    def sink(self, broker: Broker) -> _Sink:
        recorded = _Sink()
        broker.report_settled(recorded)
        return recorded

    def test_an_ack_reports_the_child_it_woke(self, broker: Broker, sink: _Sink) -> None:
        parent, child, grandchild = _chain(broker)
        steps.ack(broker, parent.id, claim_one(broker, PARENTS).token, None)
        assert sink.calls == [_stored(broker, child)]
        assert sink.calls[0][0].status is Status.PENDING
        assert broker.get(grandchild.id).status is Status.BLOCKED

    def test_a_child_waiting_for_another_parent_is_not_reported(self, broker: Broker, sink: _Sink) -> None:
        first, second = submit(broker, queue=PARENTS), submit(broker, queue="elsewhere")
        submit(broker, depends_on=(first.id, second.id))
        steps.ack(broker, first.id, claim_one(broker, PARENTS).token, None)
        assert sink.calls == []

    def test_a_settle_reports_the_children_of_all_its_items_in_one_call(
        self, broker: Broker, sink: _Sink
    ) -> None:
        parents = [submit(broker, queue=PARENTS) for _ in range(2)]
        children = [submit(broker, depends_on=(parent.id,)) for parent in parents]
        leases = steps.claim(broker, PARENTS, 2, TTL)
        answers = broker.settle(Settle(tuple(ack_item(lease) for lease in leases)))
        assert [answer.status for answer in answers if isinstance(answer, Task)] == [Status.COMPLETED] * 2
        assert len(sink.calls) == 1
        assert sorted(sink.calls[0], key=lambda t: t.id) == sorted(
            _stored(broker, *children), key=lambda t: t.id
        )

    def test_a_quiet_settle_reports_the_children_it_woke(self, broker: Broker, sink: _Sink) -> None:
        parent = submit(broker, queue=PARENTS)
        child = submit(broker, depends_on=(parent.id,))
        quiet = Settle((ack_item(claim_one(broker, PARENTS)),), snapshots=False)
        assert broker.settle(quiet) == [None]
        assert sink.calls == [_stored(broker, child)]

    def test_a_mixed_settle_reports_what_each_item_settled_in_one_call(
        self, broker: Broker, sink: _Sink
    ) -> None:
        done, broken = (submit(broker, queue=PARENTS) for _ in range(2))
        woken = submit(broker, depends_on=(done.id,))
        doomed = submit(broker, depends_on=(broken.id,))
        first, second = steps.claim(broker, PARENTS, 2, TTL)
        items = (
            Complete(first.task.id, first.token),
            Fail(second.task.id, second.token, FailureKind.SKIP, "x"),
        )
        broker.settle(Settle(items, snapshots=False))
        assert len(sink.calls) == 1
        assert sorted(sink.calls[0], key=lambda t: t.id) == sorted(
            _stored(broker, woken, doomed), key=lambda t: t.id
        )
        assert [broker.get(t.id).status for t in (woken, doomed)] == [Status.PENDING, Status.CANCELED]

    def test_acks_carried_by_a_claim_report_the_children_they_woke(self, broker: Broker, sink: _Sink) -> None:
        parent = submit(broker, queue=PARENTS)
        child = submit(broker, depends_on=(parent.id,))
        claimed = broker.claim(Claim("elsewhere", 1, TTL, acks=(ack_item(claim_one(broker, PARENTS)),)))
        assert (claimed.acked, claimed.leases) == ([None], [])
        assert sink.calls == [_stored(broker, child)]

    def test_a_failure_reports_every_descendant_it_canceled_in_order(
        self, broker: Broker, sink: _Sink, clock: ManualClock
    ) -> None:
        parent, child, grandchild = _chain(broker)
        clock.advance(1)
        steps.fail(broker, parent.id, claim_one(broker, PARENTS).token, kind=FailureKind.BUSINESS, error="x")
        assert sink.calls == [_stored(broker, child, grandchild)]
        assert {(t.status, t.finished_at) for t in sink.calls[0]} == {(Status.CANCELED, clock.now())}

    def test_a_failure_reports_a_child_ignoring_it_as_woken(self, broker: Broker, sink: _Sink) -> None:
        parent = submit(broker, queue=PARENTS)
        child = submit(broker, depends_on=(parent.id,), ignore_parent_failure=True)
        steps.fail(broker, parent.id, claim_one(broker, PARENTS).token, kind=FailureKind.BUSINESS, error="x")
        assert sink.calls == [_stored(broker, child)]
        assert sink.calls[0][0].status is Status.PENDING

    def test_a_cancel_reports_the_descendants_it_canceled(self, broker: Broker, sink: _Sink) -> None:
        parent, child, grandchild = _chain(broker)
        assert broker.cancel(parent.id).status is Status.CANCELED
        assert sink.calls == [_stored(broker, child, grandchild)]

    def test_marking_a_running_task_for_cancel_reports_nothing(self, broker: Broker, sink: _Sink) -> None:
        _canceled_running(broker)
        assert sink.calls == []

    @pytest.mark.parametrize("write", sorted(MARKED_WRITES))
    def test_a_write_that_cancels_a_marked_task_reports_its_descendants(
        self, broker: Broker, sink: _Sink, write: str
    ) -> None:
        parent_id, token, child, grandchild = _canceled_running(broker)
        done = MARKED_WRITES[write](broker, parent_id, token)
        assert done.status is Status.CANCELED
        assert sink.calls == [_stored(broker, child, grandchild)]

    def test_a_retry_reports_nothing(self, broker: Broker, sink: _Sink) -> None:
        parent, _, _ = _chain(broker)
        lease = claim_one(broker, PARENTS)
        steps.retry(broker, parent.id, lease.token, kind=FailureKind.BUSINESS, error="x", delay=timedelta(0))
        assert sink.calls == []

    def test_a_reap_past_lease_lost_max_reports_the_descendants_it_canceled(
        self, broker: Broker, sink: _Sink, clock: ManualClock
    ) -> None:
        parent, child, grandchild = _chain(broker)
        claim_one(broker, PARENTS, ttl=timedelta(seconds=1))
        clock.advance(2)
        (reaped,) = broker.reap(lease_lost_max=1)
        assert (reaped.id, reaped.status) == (parent.id, Status.FAILED)
        assert sink.calls == [_stored(broker, child, grandchild)]

    def test_a_call_that_writes_nothing_reports_nothing(self, broker: Broker, sink: _Sink) -> None:
        parent, _, _ = _chain(broker)
        claim_one(broker, PARENTS)
        with pytest.raises(LeaseLostError):
            steps.ack(broker, parent.id, "not-the-token", None)
        assert sink.calls == []

    def test_without_a_sink_nothing_is_reported(self, broker: Broker, sink: _Sink) -> None:
        broker.report_settled(None)
        parent, _, _ = _chain(broker)
        broker.cancel(parent.id)
        assert sink.calls == []
