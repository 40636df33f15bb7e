"""Batched worker writes: many acks (`Complete` items) in one transaction with set-based statements.

The statements do not grow with the batch: one locking SELECT of the tasks with their leases
(in id order, like every other multi-row lock, so two batches cannot deadlock on each other),
one DELETE of the leases, one UPDATE of the statuses, one executemany for non-null results,
and one settle pass for the children of every completed task. Items whose token is stale are
answered with their own error and not written.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Delete, Select, Update, and_, bindparam, delete, select, update

from taskgate.brokers.params import Complete, ItemAnswer
from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.graph import settle_children
from taskgate.brokers.sql.rows import chunks, snapshot, status_values
from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.errors import LeaseLostError, TaskNotFoundError
from taskgate.models import Models
from taskgate.task import Status

__all__ = ["ack_many"]


def ack_many(tx: Tx, items: Sequence[Complete], *, snapshots: bool) -> list[ItemAnswer]:
    """Complete every item whose token holds its task; answer the others with their error.

    ``snapshots=False`` answers None instead of the snapshot for each task it completed: the
    tasks are locked and written by their ids alone, no row is read back (on MySQL through
    PyMySQL, parsing the rows was most of an ack).
    """
    if tx.traits.dml_ctes and len({item.task_id for item in items}) == len(items):
        return _ack_many_in_one_statement(tx, items, snapshots)
    held = _lock_held(tx, sorted({item.task_id for item in items}), snapshots)
    winners: dict[str, int] = {}  # task id -> index of the item that completes it
    for n, item in enumerate(items):
        row = held.get(item.task_id)
        if (
            row is not None
            and item.task_id not in winners
            and secrets.compare_digest(row["token"], item.token)
        ):
            winners[item.task_id] = n
    final = {**status_values(Status.COMPLETED), "finished_at": tx.now}
    _complete(tx, [items[n] for n in winners.values()], final)
    losers = _statuses(tx, [item.task_id for item in items if item.task_id not in held])
    answers: list[ItemAnswer] = []
    for n, item in enumerate(items):
        if winners.get(item.task_id) != n:
            answers.append(_lost(item.task_id, _status_now(item.task_id, winners, held, losers)))
        elif snapshots:
            values = {**final, "result": item.result, "cancel_requested": False}
            answers.append(snapshot(held[item.task_id], values))
        else:
            answers.append(None)
    return answers


def _ack_many_in_one_statement(tx: Tx, items: Sequence[Complete], snapshots: bool) -> list[ItemAnswer]:
    """`ack_many` of distinct tasks with the lock, the token check, the lease DELETE and the
    task UPDATE in ONE statement (data-modifying CTEs); the children are settled after it.

    The children query must be a statement of its own: it has to see children whose parent
    row lock the first statement waited for (a later statement's snapshot does).
    """
    now = tx.now
    params = {
        "p_ids": [item.task_id for item in items],
        "p_tokens": [item.token for item in items],
        "p_results": [item.result for item in items],
        "p_now": now,
    }
    done = {row["id"]: row for row in tx.fetch(_complete_held(tx.models, tx.traits, snapshots), params)}
    settle_children(tx, [(task_id, Status.COMPLETED) for task_id in sorted(done)])
    others = _statuses(tx, [item.task_id for item in items if item.task_id not in done])
    return [
        _lost(item.task_id, others.get(item.task_id))
        if item.task_id not in done
        else snapshot(done[item.task_id])
        if snapshots
        else None
        for item in items
    ]


def _status_now(
    task_id: str, winners: dict[str, int], held: dict[str, Mapping[str, Any]], others: dict[str, Status]
) -> Status | None:
    if task_id in winners:
        return Status.COMPLETED  # an earlier item of this batch completed it
    if task_id in held:
        return Status.RUNNING  # held, but under another token
    return others.get(task_id)


def _lock_held(tx: Tx, ids: list[str], whole_rows: bool) -> dict[str, Mapping[str, Any]]:
    """Running tasks among ``ids`` with their lease token, locked in id order (``whole_rows``:
    every column of the task, for its snapshot; else its id alone)."""
    stmt = _held(tx.models, tx.traits, whole_rows)
    found: dict[str, Mapping[str, Any]] = {}
    for part in chunks(ids):
        found.update((row["id"], row) for row in tx.fetch(stmt, {"p_ids": part}))
    return found


def _complete(tx: Tx, items: list[Complete], final: dict[str, Any]) -> None:
    """Delete the leases, write status and results, and settle the children of ``items``."""
    if not items:
        return
    drop, finish = _finish_statements(tx.models, tx.traits)
    ids = [item.task_id for item in items]
    for part in chunks(ids):
        tx.write(drop, {"p_ids": part})
        tx.write(finish, {"p_ids": part, "p_now": final["finished_at"]})
    results = [{"b_id": item.task_id, "b_result": item.result} for item in items if item.result is not None]
    tx.write_many(_store_result(tx.models), results)
    settle_children(tx, [(task_id, Status.COMPLETED) for task_id in ids])


# The statements of every batch, built once per schema (building costs more than running).


@functools.lru_cache(maxsize=32)
def _held(models: Models, traits: Traits, whole_rows: bool) -> Select[Any]:
    task, lease = models.task, models.lease
    columns = (table_of(task),) if whole_rows else (task.id,)
    stmt = (
        select(*columns, lease.token)
        .join(lease, lease.task_id == task.id)
        .where(traits.listed(task.id, "p_ids"))
        .order_by(task.id)
    )
    return traits.lock(stmt)


@functools.lru_cache(maxsize=32)
def _complete_held(models: Models, traits: Traits, whole_rows: bool) -> Select[Any]:
    """Lock the tasks the items' tokens hold (id order), delete their leases, complete them;
    RETURNING every column (``whole_rows``) or the ids alone."""
    task, lease = table_of(models.task), table_of(models.lease)
    items = traits.unnest(
        "items",
        id=("p_ids", task.c.id.type),
        token=("p_tokens", lease.c.token.type),
        result=("p_results", task.c.result.type),
    )
    held = traits.lock(
        select(task.c.id)
        .join(lease, lease.c.task_id == task.c.id)
        .join(items, and_(items.c.id == task.c.id, items.c.token == lease.c.token))
        .order_by(task.c.id)
    ).cte("held")
    gone = delete(lease).where(lease.c.task_id.in_(select(held.c.id))).returning(lease.c.task_id).cte("gone")
    values = {
        **status_values(Status.COMPLETED),
        "finished_at": bindparam("p_now", type_=task.c.finished_at.type),
        "result": items.c.result,
    }
    done = (
        update(task)
        .where(task.c.id == items.c.id, task.c.id.in_(select(gone.c.task_id)))
        .values(values)
        .returning(*(task.c if whole_rows else (task.c.id,)))
        .cte("done")
    )
    return select(done)


@functools.lru_cache(maxsize=32)
def _store_result(models: Models) -> Update:
    task = table_of(models.task)
    return update(task).where(task.c.id == bindparam("b_id")).values(result=bindparam("b_result"))


@functools.lru_cache(maxsize=32)
def _finish_statements(models: Models, traits: Traits) -> tuple[Delete, Update]:
    task, lease = table_of(models.task), table_of(models.lease)
    drop = delete(lease).where(traits.listed(lease.c.task_id, "p_ids"))
    values = {
        **status_values(Status.COMPLETED),
        "finished_at": bindparam("p_now", type_=task.c.finished_at.type),
        "result": None,
    }
    finish = update(task).where(traits.listed(task.c.id, "p_ids")).values(values)
    return drop, finish


def _statuses(tx: Tx, ids: list[str]) -> dict[str, Status]:
    """The statuses of those ``ids`` that exist (to word the error of an item not held)."""
    task = tx.models.task
    found: dict[str, Status] = {}
    for part in chunks(sorted(set(ids))):
        rows = tx.conn.execute(select(task.id, task.status).where(task.id.in_(part)))
        found.update((row.id, Status(row.status)) for row in rows)
    return found


def _lost(task_id: str, status: Status | None) -> LeaseLostError | TaskNotFoundError:
    """The error a lone ack answers for ``task_id`` in ``status`` (None: no such task) with a bad token."""
    if status is None:
        return TaskNotFoundError(f"no task with id {task_id!r}")
    if status is not Status.RUNNING:
        return LeaseLostError(f"task {task_id} is {status.value}; the lease is gone")
    return LeaseLostError(f"task {task_id} is held under another lease")
