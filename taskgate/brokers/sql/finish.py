"""A worker's writes that end a run: ack, retry, fail (with its `compensate`), requeue,
finish_canceled (one `Settle` item each, `settle_each` for several); and `cancel`.

Each write first locks the task row together with its lease and checks the token
(`_release`), then deletes the lease and moves the task, settling its children in the same
transaction when it became final. The snapshot returned is the locked row with the values
just written applied, so no transition reads its task twice.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Delete, Select, Update, bindparam, delete, select, update

from taskgate.brokers.base import FailureKind
from taskgate.brokers.params import (
    Canceled,
    Compensation,
    Complete,
    Fail,
    Finish,
    ItemAnswer,
    Requeue,
    Retry,
)
from taskgate.brokers.sql import holds
from taskgate.brokers.sql.create import store_new
from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.graph import settle_children
from taskgate.brokers.sql.leases import CANCELED_ERROR, lease_lost_error
from taskgate.brokers.sql.rows import snapshot, status_values, write_task
from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.errors import AlreadyFinalError, LeaseLostError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.models import Models
from taskgate.task import Status, Task

__all__ = [
    "ack",
    "cancel",
    "compensate",
    "fail",
    "finish_canceled",
    "requeue",
    "retry",
    "settle_each",
    "settle_one",
]


def settle_each(tx: Tx, items: Sequence[Finish], *, snapshots: bool) -> list[ItemAnswer]:
    """Settle every item in this one transaction, each on its own: a stale token or an unknown
    id answers its item with the error and changes nothing for it (the lookup that finds it
    wrote nothing yet). None instead of the snapshot for each item settled, unless ``snapshots``.

    The tasks are locked in id order, as a batch of acks locks them, so two batches take
    their rows in the same order (a deadlock left, through the children they settle, is
    retried by the broker); items of one task keep their order (the later of two naming one
    lease finds it gone).
    """
    answers: list[ItemAnswer] = [None] * len(items)
    for n in sorted(range(len(items)), key=lambda n: items[n].task_id):
        try:
            task = settle_one(tx, items[n])
        except (LeaseLostError, TaskNotFoundError) as exc:
            answers[n] = exc
        else:
            answers[n] = task if snapshots else None
    return answers


def settle_one(tx: Tx, item: Finish) -> Task:
    """The transition ``item`` names; raises `LeaseLostError`/`TaskNotFoundError` having
    changed nothing when its token does not hold the task."""
    if isinstance(item, Complete):
        return ack(tx, item.task_id, item.token, item.result)
    if isinstance(item, Retry):
        task = retry(tx, item.task_id, item.token, item.kind, item.error, item.delay, item.traceback)
        if item.hold_queue:  # a queue-wide throttle: in the same transaction as the retry
            holds.extend(tx, task.queue, tx.now + item.delay)
        return task
    if isinstance(item, Fail):
        task = fail(tx, item.task_id, item.token, item.kind, item.error, item.traceback)
        if item.compensation is not None:  # in the transaction that failed the task
            compensate(tx, task.id, item.compensation)
        return task
    if isinstance(item, Requeue):
        return requeue(tx, item.task_id, item.token)
    if isinstance(item, Canceled):
        return finish_canceled(tx, item.task_id, item.token)
    raise TypeError(f"not a Settle item: {type(item).__name__}")  # Settle checked its items


def ack(tx: Tx, task_id: str, token: str, result: bytes | None) -> Task:
    """Complete the task with ``result``; a cancel mark does not stop an ack (the work is done)."""
    row = _release(tx, task_id, token)
    return _finish(tx, row, Status.COMPLETED, {"result": result})


def retry(
    tx: Tx,
    task_id: str,
    token: str,
    kind: FailureKind,
    error: str,
    delay: timedelta,
    traceback: str | None = None,
) -> Task:
    """Count the failure, then ``retrying`` due at now + delay, or canceled if a cancel was asked."""
    row = _release(tx, task_id, token)
    counted = _count_failure(row, kind, error, traceback)
    if row["cancel_requested"]:
        return _finish(tx, row, Status.CANCELED, counted)
    return _move(tx, row, {**counted, **status_values(Status.RETRYING), "run_at": tx.now + delay})


def fail(
    tx: Tx, task_id: str, token: str, kind: FailureKind, error: str, traceback: str | None = None
) -> Task:
    """Count the failure, set ``failed``, cancel descendants."""
    row = _release(tx, task_id, token)
    return _finish(tx, row, Status.FAILED, _count_failure(row, kind, error, traceback))


def compensate(tx: Tx, failed_id: str, compensation: Compensation) -> None:
    """Submit ``compensation`` for the task ``failed_id`` just failed, in this transaction."""
    store_new(tx, [compensation.task(failed_id, new_id())], check_ids=False)


def requeue(tx: Tx, task_id: str, token: str) -> Task:
    """Back to ``pending`` due now with no counter changed; canceled instead if a cancel was asked."""
    row = _release(tx, task_id, token)
    if row["cancel_requested"]:
        return _finish(tx, row, Status.CANCELED, {"last_error": CANCELED_ERROR})
    return _move(tx, row, {**status_values(Status.PENDING), "run_at": tx.now})


def finish_canceled(tx: Tx, task_id: str, token: str) -> Task:
    """End a running task whose handler stopped on a cancel: ``canceled`` + cascade."""
    row = _release(tx, task_id, token)
    return _finish(tx, row, Status.CANCELED, {"last_error": CANCELED_ERROR})


def cancel(tx: Tx, task_id: str) -> Task:
    """Cancel now (with cascade), or only mark a running task for its holder to stop."""
    found = tx.fetch(_locked_task(tx.models, tx.traits), {"p_id": task_id})
    if not found:
        raise TaskNotFoundError(f"no task with id {task_id!r}")
    row = found[0]
    if Status(row["status"]).is_final:
        raise AlreadyFinalError(f"task {task_id} is already {row['status']}")
    if row["status"] == Status.RUNNING.value:
        tx.write(_mark_cancel(tx.models), {"p_id": task_id})
        return snapshot(row, {"cancel_requested": True})
    return _finish(tx, row, Status.CANCELED, {"last_error": CANCELED_ERROR})


def _release(tx: Tx, task_id: str, token: str) -> Mapping[str, Any]:
    """Lock the task and its lease, check ``token``, delete the lease; return the locked row."""
    found = tx.fetch(_held_task(tx.models, tx.traits), {"p_id": task_id})
    if not found or not secrets.compare_digest(found[0]["token"], token):
        raise lease_lost_error(tx, task_id)
    tx.write(_drop_lease(tx.models), {"p_id": task_id})
    return found[0]


def _count_failure(
    row: Mapping[str, Any], kind: FailureKind, error: str, traceback: str | None
) -> dict[str, Any]:
    if kind is FailureKind.THROTTLED:
        return {"throttled": row["throttled"] + 1, "last_error": error, "last_traceback": traceback}
    return {"attempts": row["attempts"] + 1, "last_error": error, "last_traceback": traceback}


def _move(tx: Tx, row: Mapping[str, Any], values: dict[str, Any]) -> Task:
    """Write ``values`` to a task that stays claimable later (pending or retrying)."""
    write_task(tx, row["id"], values)
    tx.woken.add(row["queue"])
    return snapshot(row, {**values, "cancel_requested": False})


def _finish(tx: Tx, row: Mapping[str, Any], status: Status, values: dict[str, Any]) -> Task:
    """Make the task final with ``values`` and settle its children in the same transaction."""
    final = {**values, **status_values(status), "finished_at": tx.now}
    write_task(tx, row["id"], final)
    settle_children(tx, [(row["id"], status)])
    return snapshot(row, {**final, "cancel_requested": False})


# The statements of these transitions, built once per schema (so they run prepared).


@functools.lru_cache(maxsize=32)
def _locked_task(models: Models, traits: Traits) -> Select[Any]:
    task = table_of(models.task)
    return traits.lock(select(task).where(task.c.id == bindparam("p_id")))


@functools.lru_cache(maxsize=32)
def _held_task(models: Models, traits: Traits) -> Select[Any]:
    task, lease = table_of(models.task), table_of(models.lease)
    stmt = (
        select(task, lease.c.token, lease.c.cancel_requested)
        .join(lease, lease.c.task_id == task.c.id)
        .where(task.c.id == bindparam("p_id"))
    )
    return traits.lock(stmt)


@functools.lru_cache(maxsize=32)
def _drop_lease(models: Models) -> Delete:
    lease = table_of(models.lease)
    return delete(lease).where(lease.c.task_id == bindparam("p_id"))


@functools.lru_cache(maxsize=32)
def _mark_cancel(models: Models) -> Update:
    lease = table_of(models.lease)
    return update(lease).where(lease.c.task_id == bindparam("p_id")).values(cancel_requested=True)
