"""Converting between Python values and what the scripts store and answer: µs integers, task hashes.

Times are integer microseconds since the Unix epoch (UTC), exact in a Redis ZSET score (a
double holds integers up to 2**53 µs, i.e. beyond the year 2200) and in a Lua number.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from taskgate.brokers.base import Lease, NewTask
from taskgate.brokers.params import HELD_INDEFINITELY
from taskgate.clock import utc
from taskgate.task import STATUS_BY_VALUE, Status, Task, task_from_fields

__all__ = [
    "SNAPSHOT_FIELDS",
    "arrival_statuses",
    "arrived_tasks",
    "enqueue_args",
    "enqueued",
    "enqueued_arrivals",
    "from_us",
    "lease_from_values",
    "new_task_args",
    "task_from_values",
    "to_us",
    "ttl_us",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_MILLISECOND = timedelta(milliseconds=1)

# enqueue.lua reads this many ARGV values per task; keep the two in step.
NEW_TASK_FIELDS = 16


def to_us(when: datetime) -> int:
    """``when`` as integer microseconds since the epoch."""
    return (utc(when) - _EPOCH) // _MICROSECOND


def ttl_us(duration: timedelta) -> int:
    """``duration`` in whole microseconds."""
    return duration // _MICROSECOND


@functools.lru_cache(maxsize=4096)
def hold_from(value: bytes | str) -> datetime | None:
    """A queue's hold as the scripts answer it (`queue_hold`): µs, "-1" until resumed, "" none."""
    if value in (b"", ""):
        return None
    if value in (b"-1", "-1"):
        return HELD_INDEFINITELY
    return from_us(value)


def from_us(value: bytes | str | int) -> datetime:
    """The aware UTC datetime of a stored microsecond count.

    Cached: the tasks of one batch share their times (created together, claimed together), and
    a cache hit costs a tenth of building the datetime. Datetimes are immutable, so sharing is safe.
    """
    return _EPOCH + timedelta(microseconds=int(value))


# A task as the scripts reply it and `RedisBroker.get` reads it: the values of these hash
# fields, in this order (``HMGET``; None where unset). The script loader writes the same list
# into the Lua library (``SNAPSHOT_FIELDS``, ``AT``), so the two cannot drift apart.
SNAPSHOT_FIELDS = (
    "id",
    "type",
    "queue",
    "payload",
    "status",
    "created_at",
    "run_at",
    "result",
    "last_error",
    "attempts",
    "max_retry",
    "throttled",
    "lease_lost",
    "claims",
    "depends_on",
    "ignore_parent_failure",
    "business_key",
    "replay_of",
    "started_at",
    "finished_at",
    "timeout_ms",
    "group",
    "last_traceback",
    "progress",
    "trace_context",
    "priority",
    "cancel_requested",
    "token",
    "lease_until",
)


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()


def _time(raw: bytes | None) -> datetime | None:
    return None if raw is None else from_us(raw)


def _timeout(raw: bytes | None) -> timedelta | None:
    return None if raw is None else timedelta(milliseconds=int(raw))


def task_from_values(values: Sequence[Any]) -> Task:
    """The `Task` snapshot of a task hash, given as its `SNAPSHOT_FIELDS` values in order
    (bytes, None where unset: a script's or ``HMGET``'s reply)."""
    (
        task_id,
        task_type,
        queue,
        payload,
        status,
        created_at,
        run_at,
        result,
        last_error,
        attempts,
        max_retry,
        throttled,
        lease_lost,
        claims,
        depends_on,
        ignore_parent_failure,
        business_key,
        replay_of,
        started_at,
        finished_at,
        timeout_ms,
        group,
        last_traceback,
        progress,
        trace_context,
        priority,
        cancel_requested,
        _token,
        _lease_until,
    ) = values
    if task_id is None:
        raise ValueError("no such task hash: every snapshot field is unset")
    return task_from_fields(
        {
            "id": task_id.decode(),
            "type": task_type.decode(),
            "queue": queue.decode(),
            "payload": payload,
            "status": STATUS_BY_VALUE[status.decode()],
            "created_at": from_us(created_at),
            "run_at": from_us(run_at),
            "result": result,
            "last_error": _text(last_error),
            "attempts": int(attempts),
            "max_retry": int(max_retry),
            "throttled": int(throttled),
            "lease_lost": int(lease_lost),
            "claims": int(claims),
            "depends_on": _parents(depends_on),
            "ignore_parent_failure": ignore_parent_failure == b"1",
            "business_key": _text(business_key),
            "replay_of": _text(replay_of),
            "started_at": _time(started_at),
            "finished_at": _time(finished_at),
            "timeout": _timeout(timeout_ms),
            "group": _text(group),
            "last_traceback": _text(last_traceback),
            "progress_json": _text(progress),
            "trace_context": _text(trace_context),
            "priority": 0 if priority is None else int(priority),
            "cancel_requested": cancel_requested == b"1",
        }
    )


def _parents(stored: bytes) -> tuple[str, ...]:
    return () if stored == b"[]" else tuple(json.loads(stored))


def lease_from_values(values: Sequence[Any]) -> Lease:
    """The `Lease` of a task just claimed, given as its `SNAPSHOT_FIELDS` values (token and
    ``lease_until`` set)."""
    return Lease(task=task_from_values(values), token=values[-2].decode(), expires_at=from_us(values[-1]))


def enqueue_args(
    tasks: Sequence[NewTask], max_pending: Sequence[tuple[str, int]] = ()
) -> list[str | bytes | int]:
    """enqueue.lua's ARGV after "now": the count, the shape, the tasks, then ``max_pending``'s
    count and pairs when there are any (`Submit.max_pending`).

    ``rows``: `NEW_TASK_FIELDS` values per task. ``shared``, when every task has the same
    fields but its id and payload (what `Gate.submit_many` sends) and no business key: those
    fields once, as a template whose id and payload slots are unused, then (id, has_payload,
    payload) per task -- a quarter of the values to pack, send and read.
    """
    first = tasks[0]
    common = _shared_fields(first)
    if len(tasks) > 1 and first.business_key is None and all(_shared_fields(t) == common for t in tasks):
        args: list[str | bytes | int] = [len(tasks), "shared", *new_task_args(first)]
        for task in tasks:
            args += [task.id, 0, b""] if task.payload is None else [task.id, 1, task.payload]
    else:
        args = [len(tasks), "rows"]
        for task in tasks:
            args.extend(new_task_args(task))
    if max_pending:
        args.append(len(max_pending))
        for queue, limit in max_pending:
            args += [queue, limit]
    return args


def _shared_fields(task: NewTask) -> tuple[object, ...]:
    return (
        task.type,
        task.queue,
        task.max_retry,
        task.run_at,
        task.delay,
        task.ignore_parent_failure,
        task.business_key,
        task.depends_on,
        task.timeout,
        task.group,
        task.trace_context,
        task.priority,
    )


def new_task_args(task: NewTask) -> list[str | bytes | int]:
    """The `NEW_TASK_FIELDS` ARGV values enqueue.lua reads for one task."""
    return [
        task.id,
        task.type,
        task.queue,
        0 if task.payload is None else 1,
        b"" if task.payload is None else task.payload,
        task.max_retry,
        "" if task.run_at is None else to_us(task.run_at),
        "" if task.delay is None else ttl_us(task.delay),
        1 if task.ignore_parent_failure else 0,
        0 if task.business_key is None else 1,
        task.business_key or "",
        json.dumps(list(task.depends_on)) if task.depends_on else "[]",
        "" if task.timeout is None else task.timeout // _MILLISECOND,
        task.group or "",
        task.trace_context or "",
        task.priority,
    ]


def arrived_tasks(
    items: Sequence[NewTask], created_at: datetime, arrivals: Sequence[Sequence[bytes]]
) -> list[Task]:
    """The snapshots of the tasks enqueue.lua just stored: each item plus its arrival.

    The tasks of a batch mostly arrive alike (pending, due at the same time): each distinct
    arrival is decoded once.
    """
    decoded: dict[tuple[bytes, ...], _Arrival] = {}
    tasks = []
    for item, arrival in zip(items, arrivals, strict=True):
        key = tuple(arrival)
        known = decoded.get(key)
        if known is None:
            known = decoded[key] = _decode_arrival(arrival, created_at)
        tasks.append(_arrived_task(item, created_at, known))
    return tasks


def enqueued(values: Sequence[Any]) -> tuple[datetime, Sequence[Sequence[bytes]]]:
    """enqueue.lua's reply after "ok": the tasks' created_at and one arrival per task (sent
    one per task, or -- after ``"alike"`` -- as a count and the arrival every task shares)."""
    return from_us(values[0]), enqueued_arrivals(values)


def enqueued_arrivals(values: Sequence[Any]) -> Sequence[Sequence[bytes]]:
    """`enqueued`'s arrivals alone, for a caller that reads no time (a quiet enqueue)."""
    _, *arrivals = values
    if arrivals and arrivals[0] == b"alike":
        return [arrivals[2]] * int(arrivals[1])
    return arrivals


def arrival_statuses(arrivals: Sequence[Sequence[bytes]]) -> list[Status]:
    """The statuses of enqueue.lua's arrivals, in order."""
    return [STATUS_BY_VALUE[arrival[0].decode()] for arrival in arrivals]


# An arrival as enqueue.lua answers it, decoded: (status, run_at, last_error, finished_at).
_Arrival = tuple[Status, datetime, str | None, datetime | None]


def _decode_arrival(arrival: Sequence[bytes], created_at: datetime) -> _Arrival:
    status = STATUS_BY_VALUE[arrival[0].decode()]
    return status, from_us(arrival[1]), arrival[2].decode() or None, created_at if status.is_final else None


def _arrived_task(item: NewTask, created_at: datetime, arrival: _Arrival) -> Task:
    status, run_at, error, finished_at = arrival
    return task_from_fields(
        {
            "id": item.id,
            "type": item.type,
            "queue": item.queue,
            "payload": item.payload,
            "status": status,
            "created_at": created_at,
            "run_at": run_at,
            "result": None,
            "last_error": error,
            "attempts": 0,
            "max_retry": item.max_retry,
            "throttled": 0,
            "lease_lost": 0,
            "claims": 0,
            "depends_on": item.depends_on,
            "ignore_parent_failure": item.ignore_parent_failure,
            "business_key": item.business_key,
            "replay_of": None,
            "started_at": None,
            "finished_at": finished_at,
            "timeout": item.timeout,
            "group": item.group,
            "last_traceback": None,
            "progress_json": None,
            "trace_context": item.trace_context,
            "priority": item.priority,
            "cancel_requested": False,
        }
    )
