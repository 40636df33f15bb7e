"""One broker step per call, for tests: the verbs of `taskgate.brokers.base.Broker` in the
shape a test reads best.

A test of a broker (or of an app that drives one by hand) mostly makes one transition at a
time -- store a task, lease it, complete it -- and wants the one item's snapshot back or its
error raised. These functions build the verb's parameter object, make the call, and unwrap the
one answer: ``ack(broker, lease.task.id, lease.token, b"ok")`` is
``broker.settle(Settle((Complete(...),)))`` answered with the task or raising the item's
`LeaseLostError`/`TaskNotFoundError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from taskgate.brokers.base import UNSET, Broker, FailureKind, Lease, NewTask, QuotaSpec, Unset
from taskgate.brokers.params import (
    Canceled,
    Claim,
    Claimed,
    Complete,
    Fail,
    Finish,
    Heartbeat,
    ItemAnswer,
    QueueQuery,
    Renewal,
    Replay,
    Requeue,
    Retry,
    Settle,
    Submit,
)
from taskgate.task import Filter, Status, Task

__all__ = [
    "ack",
    "ack_many",
    "claim",
    "claim_within_quota",
    "enqueue",
    "enqueue_statuses",
    "fail",
    "finish_canceled",
    "heartbeat",
    "history",
    "queue_length",
    "replay",
    "requeue",
    "retry",
    "settle_one",
]


def enqueue(broker: Broker, tasks: Sequence[NewTask]) -> list[Task]:
    """Store ``tasks`` (all or nothing) and return their snapshots in order."""
    return broker.submit(Submit(tuple(tasks))).tasks


def enqueue_statuses(broker: Broker, tasks: Sequence[NewTask]) -> list[Status]:
    """Store ``tasks`` without asking for snapshots; their statuses on arrival."""
    return broker.submit(Submit(tuple(tasks), snapshots=False)).statuses


def claim(broker: Broker, queue: str, limit: int, lease_ttl: timedelta) -> list[Lease]:
    """Lease up to ``limit`` due tasks of ``queue``."""
    return broker.claim(Claim(queue, limit, lease_ttl)).leases


def claim_within_quota(
    broker: Broker,
    queue: str,
    limit: int,
    lease_ttl: timedelta,
    *,
    key: str,
    quota_limit: int,
    period: timedelta,
) -> Claimed:
    """Lease up to ``limit`` due tasks of ``queue``, one unit of the quota window each."""
    return broker.claim(Claim(queue, limit, lease_ttl, quota=QuotaSpec(key, quota_limit, period)))


def settle_one(broker: Broker, item: Finish) -> Task:
    """Settle one item; its snapshot, or the item's error raised."""
    (answer,) = broker.settle(Settle((item,)))
    if isinstance(answer, Exception):
        raise answer
    assert answer is not None  # snapshots were asked for
    return answer


def ack(broker: Broker, task_id: str, token: str, result: bytes | None = None) -> Task:
    """Complete the task with ``result``; `LeaseLostError`/`TaskNotFoundError` when not held."""
    return settle_one(broker, Complete(task_id, token, result))


def ack_many(broker: Broker, items: Sequence[tuple[str, str, bytes | None]]) -> list[ItemAnswer]:
    """Complete every ``(task_id, token, result)`` in one call; one answer per item."""
    return broker.settle(Settle(tuple(Complete(*item) for item in items)))


def retry(
    broker: Broker, task_id: str, token: str, *, kind: FailureKind, error: str, delay: timedelta
) -> Task:
    """Count the failure and make the task due again after ``delay``."""
    return settle_one(broker, Retry(task_id, token, kind, error, delay))


def fail(broker: Broker, task_id: str, token: str, *, kind: FailureKind, error: str) -> Task:
    """Count the failure and fail the task for good."""
    return settle_one(broker, Fail(task_id, token, kind, error))


def requeue(broker: Broker, task_id: str, token: str) -> Task:
    """Put the running task back to pending, due now."""
    return settle_one(broker, Requeue(task_id, token))


def finish_canceled(broker: Broker, task_id: str, token: str) -> Task:
    """End a run stopped by a cancel."""
    return settle_one(broker, Canceled(task_id, token))


def heartbeat(broker: Broker, task_id: str, token: str, lease_ttl: timedelta) -> Renewal:
    """Extend the lease to ``now + lease_ttl``."""
    return broker.heartbeat(Heartbeat(task_id, token, lease_ttl))


def replay(
    broker: Broker,
    execution_id: str,
    *,
    new_id: str,
    allow_completed: bool = False,
    payload: bytes | Unset | None = UNSET,
) -> Task:
    """A new execution re-running ``execution_id``."""
    return broker.replay(Replay(execution_id, new_id, allow_completed, payload))


def history(broker: Broker, business_key: str) -> list[Task]:
    """Every execution of ``business_key``, oldest first."""
    return broker.list(Filter(business_key=business_key))


def queue_length(broker: Broker, queue: str) -> int:
    """How many tasks of ``queue`` are pending or retrying (due or not)."""
    return broker.queue_state(QueueQuery(queue)).queue_len
