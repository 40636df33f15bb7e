"""Contract: `QuietEnqueuer.enqueue_quiet`, for brokers declaring ``quiet_enqueue``.

Not part of `BrokerContract`: a broker without the capability has nothing to test here. Add
`QuietEnqueueContract` to the test class of a broker that declares it. Every test holds the
quiet enqueue to what `Broker.enqueue` does with the same tasks; only the answers differ (each
task's status on arrival instead of its snapshot).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any, cast

import pytest

from taskgate.brokers.base import Broker, FailureKind, NewTask, QuietEnqueuer
from taskgate.errors import TaskExistsError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Status
from taskgate.testing.contract._support import claim_one, new_task, nonzero_counts, submit
from taskgate.testing.contract.claims import WaitContract

__all__ = ["QuietEnqueueContract"]


def _quiet(broker: Broker) -> QuietEnqueuer:
    assert broker.capabilities.quiet_enqueue, "QuietEnqueueContract is for brokers with quiet_enqueue"
    return cast(QuietEnqueuer, broker)


def _twins(**fields: Any) -> tuple[NewTask, NewTask]:
    """Two new tasks alike but for their ids."""
    one = new_task(**fields)
    return one, replace(one, id=new_id())


class QuietEnqueueContract:
    """Enqueues that answer statuses, and otherwise do what `enqueue` does."""

    def test_a_quiet_enqueue_of_no_tasks_returns_an_empty_list(self, broker: Broker) -> None:
        assert _quiet(broker).enqueue_quiet([]) == []

    def test_a_quiet_enqueue_stores_exactly_what_enqueue_stores(self, broker: Broker) -> None:
        shapes: list[dict[str, Any]] = [
            {},
            {"payload": b"\x00p"},
            {"delay": timedelta(minutes=5), "max_retry": 7},
            {"business_key": "order-1"},
        ]
        loud, quiet = [], []
        for n, shape in enumerate(shapes):
            if "business_key" in shape:  # a key names one task: each twin gets its own
                loud.append(new_task(**shape))
                quiet.append(new_task(**{**shape, "business_key": f"order-q{n}"}))
            else:
                one, other = _twins(**shape)
                loud.append(one)
                quiet.append(other)
        answers = broker.enqueue(loud)
        assert _quiet(broker).enqueue_quiet(quiet) == [Status.PENDING] * len(shapes)
        for answer, twin in zip(answers, quiet, strict=True):
            stored = broker.get(twin.id)
            assert replace(stored, id=answer.id, business_key=answer.business_key) == answer
        assert [t.id for t in broker.history("order-q3")] == [quiet[3].id]
        assert nonzero_counts(broker) == {"t": {Status.PENDING: 2 * len(shapes)}}

    def test_a_quiet_enqueue_answers_each_tasks_status_on_arrival(self, broker: Broker) -> None:
        running = submit(broker, queue="parents")
        failed = submit(broker, queue="parents")
        claim_one(broker, "parents")
        lease = claim_one(broker, "parents")
        broker.fail(failed.id, lease.token, kind=FailureKind.BUSINESS, error="boom")
        blocked, canceled, pending = (
            new_task(depends_on=(running.id,)),
            new_task(depends_on=(failed.id,)),
            new_task(depends_on=(failed.id,), ignore_parent_failure=True),
        )
        in_batch_child = new_task(depends_on=(canceled.id,))
        answers = _quiet(broker).enqueue_quiet([blocked, canceled, pending, in_batch_child])
        assert answers == [Status.BLOCKED, Status.CANCELED, Status.PENDING, Status.CANCELED]
        for task, status in zip([blocked, canceled, pending, in_batch_child], answers, strict=True):
            assert broker.get(task.id).status is status

    def test_a_quiet_enqueue_refuses_what_enqueue_refuses_and_stores_nothing(self, broker: Broker) -> None:
        used = submit(broker, business_key="taken")
        before = nonzero_counts(broker)
        twice = new_task()
        bad_batches: list[tuple[list[NewTask], type[Exception]]] = [
            ([twice, twice], ValueError),
            ([new_task(), new_task(id=used.id)], ValueError),
            ([new_task(), new_task(business_key="taken")], TaskExistsError),
            ([new_task(), new_task(depends_on=(new_id(),))], TaskNotFoundError),
        ]
        for batch, error in bad_batches:
            with pytest.raises(error):
                _quiet(broker).enqueue_quiet(batch)
            with pytest.raises(error):
                broker.enqueue(batch)
            assert nonzero_counts(broker) == before
            assert all(_missing(broker, task.id) for task in batch if task.id != used.id)

    def test_a_quiet_enqueue_wakes_a_waiter_of_its_queue(self, broker: Broker) -> None:
        WaitContract._assert_woken_by(broker, lambda: _quiet(broker).enqueue_quiet([new_task()]))


def _missing(broker: Broker, task_id: str) -> bool:
    try:
        broker.get(task_id)
    except TaskNotFoundError:
        return True
    return False
