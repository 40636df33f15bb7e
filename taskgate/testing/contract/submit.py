"""Contract: ``Submit(snapshots=False)`` -- statuses instead of snapshots, the same store.

Every broker honours the flag. Each test holds the quiet submit to what a submit asking for
snapshots does with the same tasks: only the answer differs (each task's status on arrival).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from taskgate.brokers.base import Broker, FailureKind, NewTask
from taskgate.brokers.params import Submit
from taskgate.errors import TaskExistsError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Status
from taskgate.testing import steps
from taskgate.testing.contract._support import claim_one, new_task, nonzero_counts, submit
from taskgate.testing.contract.claims import WaitContract

__all__ = ["SubmitContract"]


def _quietly(broker: Broker, tasks: list[NewTask]) -> list[Status]:
    submitted = broker.submit(Submit(tuple(tasks), snapshots=False))
    assert submitted.tasks == [], "a submit without snapshots answers no snapshots"
    return submitted.statuses


class SubmitContract:
    """Submits that answer statuses only, and otherwise do what a submit does."""

    def test_a_submit_answers_each_tasks_status_and_snapshot(self, broker: Broker) -> None:
        parent = new_task(queue="parents")
        submitted = broker.submit(Submit((parent, new_task(depends_on=(parent.id,)))))
        assert submitted.statuses == [Status.PENDING, Status.BLOCKED]
        assert [t.status for t in submitted.tasks] == submitted.statuses
        assert submitted.tasks == [broker.get(t.id) for t in submitted.tasks]

    def test_a_quiet_submit_of_no_tasks_returns_no_statuses(self, broker: Broker) -> None:
        assert _quietly(broker, []) == []

    def test_a_quiet_submit_stores_exactly_what_a_submit_stores(self, broker: Broker) -> None:
        shapes: list[dict[str, Any]] = [
            {},
            {"payload": b"\x00p"},
            {"delay": timedelta(minutes=5), "max_retry": 7},
            {"business_key": "order-1"},
            {"timeout": timedelta(seconds=30)},
        ]
        loud, quiet = [], []
        for n, shape in enumerate(shapes):
            one = new_task(**shape)
            loud.append(one)
            # A key names one task: each twin gets its own.
            quiet.append(replace(one, id=new_id(), business_key=one.business_key and f"order-q{n}"))
        answers = steps.enqueue(broker, loud)
        assert _quietly(broker, quiet) == [Status.PENDING] * len(shapes)
        for answer, twin in zip(answers, quiet, strict=True):
            stored = broker.get(twin.id)
            assert replace(stored, id=answer.id, business_key=answer.business_key) == answer
        assert [t.id for t in steps.history(broker, "order-q3")] == [quiet[3].id]
        assert nonzero_counts(broker) == {"t": {Status.PENDING: 2 * len(shapes)}}

    def test_a_quiet_submit_answers_each_tasks_status_on_arrival(self, broker: Broker) -> None:
        running = submit(broker, queue="parents")
        failed = submit(broker, queue="parents")
        claim_one(broker, "parents")
        lease = claim_one(broker, "parents")
        steps.fail(broker, failed.id, lease.token, kind=FailureKind.BUSINESS, error="boom")
        blocked, canceled, pending = (
            new_task(depends_on=(running.id,)),
            new_task(depends_on=(failed.id,)),
            new_task(depends_on=(failed.id,), ignore_parent_failure=True),
        )
        in_batch_child = new_task(depends_on=(canceled.id,))
        answers = _quietly(broker, [blocked, canceled, pending, in_batch_child])
        assert answers == [Status.BLOCKED, Status.CANCELED, Status.PENDING, Status.CANCELED]
        for task, status in zip([blocked, canceled, pending, in_batch_child], answers, strict=True):
            assert broker.get(task.id).status is status

    def test_a_quiet_submit_refuses_what_a_submit_refuses_and_stores_nothing(self, broker: Broker) -> None:
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
                _quietly(broker, batch)
            with pytest.raises(error):
                steps.enqueue(broker, batch)
            assert nonzero_counts(broker) == before
            assert all(_missing(broker, task.id) for task in batch if task.id != used.id)

    def test_a_quiet_submit_wakes_a_waiter_of_its_queue(self, broker: Broker) -> None:
        WaitContract._assert_woken_by(broker, lambda: _quietly(broker, [new_task()]))


def _missing(broker: Broker, task_id: str) -> bool:
    try:
        broker.get(task_id)
    except TaskNotFoundError:
        return True
    return False
