"""A worker's writes that end a run: ack, retry, fail, requeue, finish_canceled; and `cancel`.

Each write first locks the task row and checks the lease token (`_release`), then deletes the
lease and moves the task, settling its children in the same transaction when it became final.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from sqlalchemy import Row, delete, select, update

from taskgate.brokers.base import FailureKind
from taskgate.brokers.sql.graph import settle_children
from taskgate.brokers.sql.leases import CANCELED_ERROR, lease_lost_error
from taskgate.brokers.sql.rows import status_values, task_of
from taskgate.brokers.sql.tx import Tx
from taskgate.errors import AlreadyFinalError, TaskNotFoundError
from taskgate.task import Status, Task

__all__ = ["ack", "cancel", "fail", "finish_canceled", "requeue", "retry"]


def ack(tx: Tx, task_id: str, token: str, result: bytes | None) -> Task:
    """Complete the task with ``result``; a cancel mark does not stop an ack (the work is done)."""
    _release(tx, task_id, token)
    return _finish(tx, task_id, Status.COMPLETED, {"result": result})


def retry(tx: Tx, task_id: str, token: str, kind: FailureKind, error: str, delay: timedelta) -> Task:
    """Count the failure, then ``retrying`` due at now + delay, or canceled if a cancel was asked."""
    row = _release(tx, task_id, token)
    counted = _count_failure(row, kind, error)
    if row.cancel_requested:
        return _finish(tx, task_id, Status.CANCELED, counted)
    values = {**counted, **status_values(Status.RETRYING), "run_at": tx.now + delay}
    return _move(tx, task_id, row.queue, values)


def fail(tx: Tx, task_id: str, token: str, kind: FailureKind, error: str) -> Task:
    """Count the failure, set ``failed``, cancel descendants."""
    row = _release(tx, task_id, token)
    return _finish(tx, task_id, Status.FAILED, _count_failure(row, kind, error))


def requeue(tx: Tx, task_id: str, token: str) -> Task:
    """Back to ``pending`` due now with no counter changed; canceled instead if a cancel was asked."""
    row = _release(tx, task_id, token)
    if row.cancel_requested:
        return _finish(tx, task_id, Status.CANCELED, {"last_error": CANCELED_ERROR})
    return _move(tx, task_id, row.queue, {**status_values(Status.PENDING), "run_at": tx.now})


def finish_canceled(tx: Tx, task_id: str, token: str) -> Task:
    """End a running task whose handler stopped on a cancel: ``canceled`` + cascade."""
    _release(tx, task_id, token)
    return _finish(tx, task_id, Status.CANCELED, {"last_error": CANCELED_ERROR})


def cancel(tx: Tx, task_id: str) -> Task:
    """Cancel now (with cascade), or only mark a running task for its holder to stop."""
    task = tx.models.task
    stmt = tx.traits.lock(select(task.status).where(task.id == task_id))
    status = tx.conn.execute(stmt).scalar()
    if status is None:
        raise TaskNotFoundError(f"no task with id {task_id!r}")
    if Status(status).is_final:
        raise AlreadyFinalError(f"task {task_id} is already {status}")
    if status == Status.RUNNING.value:
        lease = tx.models.lease
        tx.conn.execute(update(lease).where(lease.task_id == task_id).values(cancel_requested=True))
        return task_of(tx, task_id)
    return _finish(tx, task_id, Status.CANCELED, {"last_error": CANCELED_ERROR})


def _release(tx: Tx, task_id: str, token: str) -> Row[str, int, int, str, bool]:
    """Lock the task, check ``token`` is its lease, delete the lease; return queue and cancel mark."""
    task, lease = tx.models.task, tx.models.lease
    stmt = (
        select(task.queue, task.attempts, task.throttled, lease.token, lease.cancel_requested)
        .join(lease, lease.task_id == task.id)
        .where(task.id == task_id)
    )
    row = tx.conn.execute(tx.traits.lock(stmt)).first()
    if row is None or not secrets.compare_digest(row.token, token):
        raise lease_lost_error(tx, task_id)
    tx.conn.execute(delete(lease).where(lease.task_id == task_id))
    return row


def _count_failure(row: Row[str, int, int, str, bool], kind: FailureKind, error: str) -> dict[str, Any]:
    if kind is FailureKind.THROTTLED:
        return {"throttled": row.throttled + 1, "last_error": error}
    return {"attempts": row.attempts + 1, "last_error": error}


def _move(tx: Tx, task_id: str, queue: str, values: dict[str, Any]) -> Task:
    task = tx.models.task
    tx.conn.execute(update(task).where(task.id == task_id).values(values))
    tx.woken.add(queue)
    return task_of(tx, task_id)


def _finish(tx: Tx, task_id: str, status: Status, values: dict[str, Any]) -> Task:
    task = tx.models.task
    final = {**values, **status_values(status), "finished_at": tx.now}
    tx.conn.execute(update(task).where(task.id == task_id).values(final))
    settle_children(tx, [(task_id, status)])
    return task_of(tx, task_id)
