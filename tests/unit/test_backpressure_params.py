"""Back-pressure's pieces that need no store: `QueueFullError` and `Submit.max_pending`."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import taskgate
from taskgate import QueueFullError, TaskgateError
from taskgate.brokers.base import NewTask
from taskgate.brokers.params import Submit


def _task(queue: str) -> NewTask:
    return NewTask(id=f"id-{queue}-{id(object())}", type="t", queue=queue)


def test_queue_full_error_names_its_figures_and_survives_pickling() -> None:
    error = QueueFullError("llm", 10, 9, 2)
    assert isinstance(error, TaskgateError)
    assert taskgate.QueueFullError is QueueFullError and "QueueFullError" in taskgate.__all__
    assert "'llm'" in str(error) and "max_pending=10" in str(error) and "9 task(s) waiting" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.queue, copy.max_pending, copy.waiting, copy.adding) == ("llm", 10, 9, 2)
    assert str(copy) == str(error)


def test_a_submit_names_its_limited_queues_with_the_batchs_share_of_each() -> None:
    tasks = (_task("a"), _task("b"), _task("a"), _task("c"))
    submit = Submit(tasks, max_pending=(("a", 5), ("b", 1), ("z", 3)))
    assert submit.limited() == [("a", 5, 2), ("b", 1, 1)]
    assert Submit(tasks).limited() == []


@pytest.mark.parametrize(
    ("limits", "error", "match"),
    [
        ("a", TypeError, r"Submit\.max_pending must be a sequence"),
        ((["a", 5],), TypeError, r"Submit\.max_pending\[0\] has the wrong type"),
        ((("a",),), ValueError, r"Submit\.max_pending\[0\] must be a \(queue, limit\) pair"),
        ((("a", 0),), ValueError, r"Submit\.max_pending\[0\] limit must be >= 1, got 0"),
        ((("a", True),), TypeError, r"Submit\.max_pending\[0\] limit must be an int"),
        ((("", 1),), ValueError, r"Submit\.max_pending\[0\] queue must not be empty"),
        ((("b", 1), ("a", 1)), ValueError, r"sorted by queue, each queue once"),
        ((("a", 1), ("a", 2)), ValueError, r"sorted by queue, each queue once"),
    ],
)
def test_bad_limits_are_refused_naming_the_field(limits: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Submit((_task("a"),), max_pending=limits)
