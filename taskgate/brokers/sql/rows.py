"""Reading task rows back as `Task` snapshots (with their parents and cancel mark)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Row, Select, select

from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.errors import TaskNotFoundError
from taskgate.models import Models
from taskgate.task import Status, Task

__all__ = [
    "READY",
    "chunks",
    "load_tasks",
    "parents_of",
    "snapshot_select",
    "status_values",
    "task_of",
    "to_task",
]

READY = frozenset({Status.PENDING, Status.RETRYING})

# Bound parameters per IN list: far below every database's limit (SQLite's is 32766).
_CHUNK = 500


def status_values(status: Status) -> dict[str, Any]:
    """The column values that put a row in ``status``; the only way a status is written.

    ``ready`` must follow ``status`` exactly, so every transition takes both from here.
    """
    return {"status": status.value, "ready": status in READY}


def chunks(items: Sequence[str], size: int = _CHUNK) -> Iterable[Sequence[str]]:
    """``items`` in slices small enough for one IN list."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def snapshot_select(models: Models) -> Select[Any]:
    """SELECT of task rows plus the cancel mark of their lease, if any."""
    task, lease = models.task, models.lease
    return select(table_of(task), lease.cancel_requested).outerjoin(lease, lease.task_id == task.id)


def load_tasks(tx: Tx, stmt: Select[Any]) -> list[Task]:
    """Run a `snapshot_select` statement and build the snapshots, in the statement's order."""
    rows = tx.conn.execute(stmt).all()
    parents = parents_of(tx, [row.id for row in rows])
    return [to_task(row, parents.get(row.id, ()), bool(row.cancel_requested)) for row in rows]


def task_of(tx: Tx, task_id: str) -> Task:
    """The snapshot of ``task_id``; raises `TaskNotFoundError`."""
    found = load_tasks(tx, snapshot_select(tx.models).where(tx.models.task.id == task_id))
    if not found:
        raise TaskNotFoundError(f"no task with id {task_id!r}")
    return found[0]


def parents_of(tx: Tx, ids: Sequence[str]) -> Mapping[str, tuple[str, ...]]:
    """``depends_on`` of each task in ``ids``, in the order it was given."""
    dep = tx.models.dependency
    found: defaultdict[str, list[str]] = defaultdict(list)
    for part in chunks(ids):
        stmt = (
            select(dep.child_id, dep.parent_id)
            .where(dep.child_id.in_(part))
            .order_by(dep.child_id, dep.position)
        )
        for child_id, parent_id in tx.conn.execute(stmt):
            found[child_id].append(parent_id)
    return {child: tuple(parents) for child, parents in found.items()}


def to_task(row: Row[Any], depends_on: tuple[str, ...], cancel_requested: bool = False) -> Task:
    """A snapshot from a task row."""
    return Task(
        id=row.id,
        type=row.type,
        queue=row.queue,
        payload=row.payload,
        status=Status(row.status),
        created_at=row.created_at,
        run_at=row.run_at,
        result=row.result,
        last_error=row.last_error,
        attempts=row.attempts,
        max_retry=row.max_retry,
        throttled=row.throttled,
        lease_lost=row.lease_lost,
        claims=row.claims,
        depends_on=depends_on,
        ignore_parent_failure=bool(row.ignore_parent_failure),
        business_key=row.business_key,
        replay_of=row.replay_of,
        started_at=row.started_at,
        finished_at=row.finished_at,
        cancel_requested=cancel_requested,
    )
