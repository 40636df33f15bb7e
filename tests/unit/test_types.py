from __future__ import annotations

import copy
import dataclasses
import math
import pickle
from datetime import UTC, datetime, timedelta

import pytest

import taskgate
from taskgate import Filter, Status, Task, TaskExistsError, TaskFailedError
from taskgate.brokers.base import NewTask, check_identifier
from taskgate.task import TASK_FIELDS, task_from_fields

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_status_is_a_lower_case_str_enum_with_finality() -> None:
    assert Status("pending") is Status.PENDING
    assert Status.COMPLETED == "completed"
    assert [s for s in Status if s.is_final] == [Status.COMPLETED, Status.FAILED, Status.CANCELED]


def test_task_decodes_payload_and_result_as_json() -> None:
    task = Task(
        id="a",
        type="t",
        queue="q",
        payload=b'{"x":1}',
        status=Status.COMPLETED,
        created_at=NOW,
        run_at=NOW,
        result=b"[1,2]",
    )
    assert task.json() == {"x": 1}
    assert task.result_json() == [1, 2]
    empty = Task(id="b", type="t", queue="q", payload=None, status=Status.PENDING, created_at=NOW, run_at=NOW)
    assert empty.json() is None
    assert empty.result_json() is None


@pytest.mark.parametrize(("claims", "first"), [(0, False), (1, True), (2, False), (7, False)])
def test_a_task_is_on_its_first_run_on_its_first_claim_only(claims: int, first: bool) -> None:
    task = Task(id="a", type="t", queue="q", payload=None, status=Status.RUNNING, created_at=NOW, run_at=NOW)
    assert dataclasses.replace(task, claims=claims).first_run is first


def test_a_task_from_fields_is_the_task_its_constructor_makes() -> None:
    values = {
        "id": "a",
        "type": "t",
        "queue": "q",
        "payload": b"p",
        "status": Status.RUNNING,
        "created_at": NOW,
        "run_at": NOW,
        "result": None,
        "last_error": "e",
        "attempts": 1,
        "max_retry": 2,
        "throttled": 3,
        "lease_lost": 4,
        "claims": 5,
        "depends_on": ("x",),
        "ignore_parent_failure": True,
        "business_key": "k",
        "replay_of": None,
        "started_at": NOW,
        "finished_at": None,
        "timeout": timedelta(seconds=30),
        "group": "tenant-1",
        "last_traceback": "Traceback (most recent call last): ...",
        "progress_json": '{"done":1}',
        "trace_context": '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}',
        "priority": -3,
        "cancel_requested": True,
    }
    assert tuple(values) == TASK_FIELDS
    adopted = task_from_fields(dict(values))
    built = Task(**values)  # type: ignore[arg-type]
    assert adopted == built
    assert hash(adopted) == hash(built)
    assert dataclasses.astuple(adopted) == dataclasses.astuple(built)
    assert dataclasses.replace(adopted, attempts=9).attempts == 9
    assert pickle.loads(pickle.dumps(adopted)) == built
    assert copy.deepcopy(adopted) == built
    with pytest.raises(dataclasses.FrozenInstanceError):
        adopted.attempts = 7  # type: ignore[misc]


def test_filter_rejects_negative_paging_and_reads_status_strings() -> None:
    with pytest.raises(ValueError, match="limit"):
        Filter(limit=-1)
    with pytest.raises(ValueError, match="offset"):
        Filter(offset=-1)
    assert Filter(status="failed").status is Status.FAILED  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Filter(status="nope")  # type: ignore[arg-type]


def test_errors_share_one_root_and_carry_their_data() -> None:
    exists = TaskExistsError("order-42", "01ABC", Status.FAILED)
    assert isinstance(exists, taskgate.TaskgateError)
    assert (exists.business_key, exists.execution_id, exists.status) == ("order-42", "01ABC", Status.FAILED)
    task = Task(
        id="x",
        type="t",
        queue="q",
        payload=None,
        status=Status.FAILED,
        created_at=NOW,
        run_at=NOW,
        last_error="boom",
    )
    failed = TaskFailedError(task)
    assert failed.task is task and "boom" in str(failed)


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -math.inf, -1, 1e12, taskgate.Throttled.MAX_RETRY_AFTER + 1, 10**400]
)
def test_throttled_refuses_a_retry_after_beyond_finite_seconds_up_to_its_maximum(bad: float) -> None:
    with pytest.raises(ValueError, match="retry_after must be from 0 to 2592000 seconds"):
        taskgate.Throttled(retry_after=bad)


def test_throttled_takes_a_retry_after_up_to_thirty_days_in_seconds_only() -> None:
    assert taskgate.Throttled.MAX_RETRY_AFTER == 30 * 86_400
    assert taskgate.Throttled(retry_after=taskgate.Throttled.MAX_RETRY_AFTER).retry_after == 2_592_000.0
    assert taskgate.Throttled(retry_after=0).retry_after == 0.0
    for wrong in ["5", None, True, timedelta(seconds=5)]:
        with pytest.raises(TypeError, match="retry_after must be a number of seconds"):
            taskgate.Throttled(retry_after=wrong)  # type: ignore[arg-type]


def test_throttled_and_skip_retry_carry_their_reason() -> None:
    assert taskgate.Throttled(retry_after=30).retry_after == 30.0
    with pytest.raises(ValueError, match="retry_after"):
        taskgate.Throttled(retry_after=-1)
    cause = RuntimeError("card declined")
    skip = taskgate.SkipRetry(cause)
    assert skip.__cause__ is cause and "card declined" in str(skip)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"type": ""}, "task type must not be empty"),
        ({"type": "x" * 256}, "at most 255"),
        ({"queue": 5}, "queue must be a str"),
        ({"business_key": ""}, "business_key must not be empty"),
        ({"payload": "text"}, "payload must be bytes"),
        ({"max_retry": -1}, "max_retry must be >= 0"),
        ({"max_retry": True}, "max_retry must be an int"),
        ({"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"delay": timedelta(seconds=-1)}, "delay"),
        ({"delay": timedelta(days=40_000)}, "delay must be a timedelta from 0 to 36500 days"),
        ({"timeout": timedelta(0)}, r"timeout must be a timedelta above 0 .* got datetime.timedelta\(0\)"),
        ({"timeout": timedelta(seconds=-1)}, "timeout must be a timedelta above 0"),
        ({"timeout": timedelta(days=36_501)}, "timeout .* at most 36500 days"),
        ({"timeout": 30}, "timeout must be a timedelta or None, got int: 30"),
        ({"timeout": "30s"}, "timeout must be a timedelta or None, got str"),
        ({"depends_on": "abc"}, "not a single str"),
        ({"depends_on": ("id1",)}, "cannot depend on itself"),
    ],
)
def test_new_task_rejects_bad_fields_by_name(kwargs: dict[str, object], match: str) -> None:
    fields: dict[str, object] = {"id": "id1", "type": "t", "queue": "q"} | kwargs
    with pytest.raises((TypeError, ValueError), match=match):
        NewTask(**fields)  # type: ignore[arg-type]


def test_new_task_keeps_its_timeout_in_whole_milliseconds_rounded_up() -> None:
    def timeout(value: timedelta) -> timedelta | None:
        return NewTask(id="id1", type="t", queue="q", timeout=value).timeout

    assert timeout(timedelta(seconds=30)) == timedelta(seconds=30)
    assert timeout(timedelta(microseconds=1)) == timedelta(milliseconds=1)
    assert timeout(timedelta(milliseconds=2, microseconds=1)) == timedelta(milliseconds=3)
    assert timeout(timedelta(days=36_500)) == timedelta(days=36_500)
    assert NewTask(id="id1", type="t", queue="q").timeout is None


def test_identifiers_refuse_nul_characters() -> None:
    with pytest.raises(ValueError, match="NUL"):
        check_identifier("a\x00b", what="task id")
