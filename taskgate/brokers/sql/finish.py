"""A worker's writes that end a run: ack, retry, fail, requeue, finish_canceled; and `cancel`.

Each write first locks the task row together with its lease and checks the token
(`_release`), then deletes the lease and moves the task, settling its children in the same
transaction when it became final. The snapshot returned is the locked row with the values
just written applied, so no transition reads its task twice.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from sqlalchemy import Row, delete, select, update

from taskgate.brokers.base import FailureKind
from taskgate.brokers.sql.graph import settle_children
from taskgate.brokers.sql.leases import CANCELED_ERROR, lease_lost_error
from taskgate.brokers.sql.rows import snapshot, status_values
from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.errors import AlreadyFinalError, TaskNotFoundError
from taskgate.task import Status, Task

__all__ = ["ack", "cancel", "fail", "finish_canceled", "requeue", "retry"]


def ack(tx: Tx, task_id: str, token: str, result: bytes | None) -> Task:
    """Complete the task with ``result``; a cancel mark does not stop an ack (the work is done)."""
    row = _release(tx, task_id, token)
    return _finish(tx, row, Status.COMPLETED, {"result": result})


def retry(tx: Tx, task_id: str, token: str, kind: FailureKind, error: str, delay: timedelta) -> Task:
    """Count the failure, then ``retrying`` due at now + delay, or canceled if a cancel was asked."""
    row = _release(tx, task_id, token)
    counted = _count_failure(row, kind, error)
    if row.cancel_requested:
        return _finish(tx, row, Status.CANCELED, counted)
    return _move(tx, row, {**counted, **status_values(Status.RETRYING), "run_at": tx.now + delay})


def fail(tx: Tx, task_id: str, token: str, kind: FailureKind, error: str) -> Task:
    """Count the failure, set ``failed``, cancel descendants."""
    row = _release(tx, task_id, token)
    return _finish(tx, row, Status.FAILED, _count_failure(row, kind, error))


def requeue(tx: Tx, task_id: str, token: str) -> Task:
    """Back to ``pending`` due now with no counter changed; canceled instead if a cancel was asked."""
    row = _release(tx, task_id, token)
    if row.cancel_requested:
        return _finish(tx, row, Status.CANCELED, {"last_error": CANCELED_ERROR})
    return _move(tx, row, {**status_values(Status.PENDING), "run_at": tx.now})


def finish_canceled(tx: Tx, task_id: str, token: str) -> Task:
    """End a running task whose handler stopped on a cancel: ``canceled`` + cascade."""
    row = _release(tx, task_id, token)
    return _finish(tx, row, Status.CANCELED, {"last_error": CANCELED_ERROR})


def cancel(tx: Tx, task_id: str) -> Task:
    """Cancel now (with cascade), or only mark a running task for its holder to stop."""
    task, lease = tx.models.task, tx.models.lease
    stmt = select(table_of(task)).where(task.id == task_id)
    row = tx.conn.execute(tx.traits.lock(stmt)).first()
    if row is None:
        raise TaskNotFoundError(f"no task with id {task_id!r}")
    if Status(row.status).is_final:
        raise AlreadyFinalError(f"task {task_id} is already {row.status}")
    if row.status == Status.RUNNING.value:
        tx.conn.execute(update(lease).where(lease.task_id == task_id).values(cancel_requested=True))
        return snapshot(row, {"cancel_requested": True})
    return _finish(tx, row, Status.CANCELED, {"last_error": CANCELED_ERROR})


def _release(tx: Tx, task_id: str, token: str) -> Row[Any]:
    """Lock the task and its lease, check ``token``, delete the lease; return the locked row."""
    task, lease = tx.models.task, tx.models.lease
    stmt = (
        select(table_of(task), lease.token, lease.cancel_requested)
        .join(lease, lease.task_id == task.id)
        .where(task.id == task_id)
    )
    row = tx.conn.execute(tx.traits.lock(stmt)).first()
    if row is None or not secrets.compare_digest(row.token, token):
        raise lease_lost_error(tx, task_id)
    tx.conn.execute(delete(lease).where(lease.task_id == task_id))
    return row


def _count_failure(row: Row[Any], kind: FailureKind, error: str) -> dict[str, Any]:
    if kind is FailureKind.THROTTLED:
        return {"throttled": row.throttled + 1, "last_error": error}
    return {"attempts": row.attempts + 1, "last_error": error}


def _move(tx: Tx, row: Row[Any], values: dict[str, Any]) -> Task:
    """Write ``values`` to a task that stays claimable later (pending or retrying)."""
    task = tx.models.task
    tx.conn.execute(update(task).where(task.id == row.id).values(values))
    tx.woken.add(row.queue)
    return snapshot(row, {**values, "cancel_requested": False})


def _finish(tx: Tx, row: Row[Any], status: Status, values: dict[str, Any]) -> Task:
    """Make the task final with ``values`` and settle its children in the same transaction."""
    task = tx.models.task
    final = {**values, **status_values(status), "finished_at": tx.now}
    tx.conn.execute(update(task).where(task.id == row.id).values(final))
    settle_children(tx, [(row.id, status)])
    return snapshot(row, {**final, "cancel_requested": False})
