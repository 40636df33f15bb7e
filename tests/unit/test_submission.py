from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from taskgate import Config, QueueConfig
from taskgate.brokers.base import NewTask
from taskgate.brokers.memory import MemoryBroker
from taskgate.runtime.submission import build_tasks

CONFIG = Config(broker=MemoryBroker(), queues={"t": QueueConfig(workers=1)})


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"business_keys": ["a", None, "c"], "max_retry": 4},
        {"delay": "5s", "depends_on": ["parent-1", "parent-2"], "ignore_parent_failure": True},
        {"run_at": datetime(2030, 1, 1, tzinfo=UTC), "delay": timedelta(seconds=3)},
        {"timeout": "1m30s"},
        {"group": "user-42"},
        {"priority": 7},
    ],
)
def test_every_task_of_a_batch_equals_one_built_and_checked_on_its_own(options: dict[str, object]) -> None:
    tasks = build_tasks(CONFIG, "t", [None, {"x": 1}, b"raw"], **options)  # type: ignore[arg-type]
    rebuilt = [
        NewTask(
            id=t.id,
            type=t.type,
            queue=t.queue,
            payload=t.payload,
            max_retry=t.max_retry,
            run_at=t.run_at,
            delay=t.delay,
            depends_on=t.depends_on,
            ignore_parent_failure=t.ignore_parent_failure,
            business_key=t.business_key,
            timeout=t.timeout,
            group=t.group,
            priority=t.priority,
        )
        for t in tasks
    ]
    assert tasks == rebuilt
    assert [t.payload for t in tasks] == [None, b'{"x":1}', b"raw"]
    assert len({t.id for t in tasks}) == 3
    assert [t.business_key for t in tasks] == list(options.get("business_keys", [None] * 3))  # type: ignore[call-overload]


def test_a_batch_shares_nothing_mutable_and_each_task_is_frozen() -> None:
    first, second = build_tasks(CONFIG, "t", [1, 2], depends_on=["p"])
    assert first.depends_on is second.depends_on  # a tuple: sharing it is safe
    with pytest.raises(AttributeError):
        second.payload = b"changed"  # type: ignore[misc]


def test_an_empty_batch_builds_nothing() -> None:
    assert build_tasks(CONFIG, "t", []) == []


@pytest.mark.parametrize(
    ("timeout", "stored"),
    [
        (None, None),
        ("30s", timedelta(seconds=30)),
        (0.25, timedelta(milliseconds=250)),
        (2, timedelta(seconds=2)),
        (timedelta(microseconds=1), timedelta(milliseconds=1)),  # whole milliseconds, rounded up
    ],
)
def test_a_timeout_is_read_like_every_duration_and_kept_in_milliseconds(
    timeout: object, stored: timedelta | None
) -> None:
    tasks = build_tasks(CONFIG, "t", [1, 2], timeout=timeout)  # type: ignore[arg-type]
    assert [t.timeout for t in tasks] == [stored, stored]


def test_every_task_of_a_batch_is_in_the_group_given() -> None:
    assert [t.group for t in build_tasks(CONFIG, "t", [1, 2], group="tenant-7")] == ["tenant-7"] * 2
    assert [t.group for t in build_tasks(CONFIG, "t", [1])] == [None]


@pytest.mark.parametrize(
    ("group", "error"),
    [("", ValueError), ("g" * 256, ValueError), (42, TypeError), ("a\x00b", ValueError)],
)
def test_a_bad_group_is_refused_naming_it(group: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="group"):
        build_tasks(CONFIG, "t", [1], group=group)  # type: ignore[arg-type]


def test_every_task_of_a_batch_has_the_priority_given() -> None:
    assert [t.priority for t in build_tasks(CONFIG, "t", [1, 2], priority=-4)] == [-4, -4]
    assert [t.priority for t in build_tasks(CONFIG, "t", [1])] == [0]


@pytest.mark.parametrize(
    ("priority", "error"),
    [(True, TypeError), (None, TypeError), (2.0, TypeError), (2**31, ValueError), (-(2**31) - 1, ValueError)],
)
def test_a_bad_priority_is_refused_naming_it_even_for_no_payloads(
    priority: object, error: type[Exception]
) -> None:
    for payloads in ([1], []):
        with pytest.raises(error, match="priority"):
            build_tasks(CONFIG, "t", payloads, priority=priority)  # type: ignore[arg-type]
