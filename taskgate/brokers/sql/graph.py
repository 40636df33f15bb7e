"""The dependency graph: a new task's status on arrival, and settling children of a final task.

Settling walks the edge table level by level (never recursion in Python or SQL): children
of the tasks that just became final are locked, the ready ones woken, and the broken ones
canceled, whose children are settled next. It runs inside the transition that made the
parent final, so "parent done, child still blocked" is never observable. While the broker
reports what it settles (``tx.settled``), the children are locked as whole rows, so each one
it moves gives its snapshot without a second read.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Select, select

from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.rows import chunks, snapshot, status_values, write_task
from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.models import Models
from taskgate.task import Status

__all__ = ["arrival_status", "parent_error", "settle_children"]

_BROKEN = frozenset({Status.FAILED, Status.CANCELED})


def parent_error(parent_id: str, status: Status) -> str:
    """The ``last_error`` of a task canceled because of its parent."""
    return f"canceled because parent {parent_id} {status.value}"


def arrival_status(
    parents: Sequence[tuple[str, Status]], ignore_parent_failure: bool
) -> tuple[Status, str | None]:
    """The status a task with ``parents`` (id, status) starts in, and its error if canceled."""
    if not ignore_parent_failure:
        for parent_id, status in parents:
            if status in _BROKEN:
                return Status.CANCELED, parent_error(parent_id, status)
        if all(status is Status.COMPLETED for _, status in parents):
            return Status.PENDING, None
    elif all(status.is_final for _, status in parents):
        return Status.PENDING, None
    return Status.BLOCKED, None


def settle_children(tx: Tx, finals: Iterable[tuple[str, Status]]) -> None:
    """After ``finals`` (id, final status) became final: wake or cancel their blocked children
    (and add their snapshots to ``tx.settled`` when it is a list)."""
    level = dict(finals)
    while level:
        children = _blocked_children(tx, list(level))
        if not children:
            return
        parents = _parents_of(tx, list(children))
        level = {}
        for child_id, row in sorted(children.items()):
            status, error = arrival_status(parents[child_id], bool(row["ignore_parent_failure"]))
            if status is Status.BLOCKED:
                continue
            values = _set(tx, child_id, status, error)
            if status is Status.PENDING:
                tx.woken.add(row["queue"])
            else:
                level[child_id] = status
            if tx.settled is not None:
                tx.settled.append(snapshot(row, {**values, "cancel_requested": False}))


def _blocked_children(tx: Tx, parent_ids: list[str]) -> dict[str, Mapping[str, Any]]:
    """Blocked children of ``parent_ids``, locked: id -> row (id, queue and
    ignore_parent_failure; every column while ``tx.settled`` collects snapshots)."""
    stmt = _blocked_children_of(tx.models, tx.traits, tx.settled is not None)
    found: dict[str, Mapping[str, Any]] = {}
    for part in chunks(parent_ids):
        for row in tx.fetch(stmt, {"p_parents": part}):
            found[row["id"]] = row
    return found


@functools.lru_cache(maxsize=32)
def _blocked_children_of(models: Models, traits: Traits, whole_rows: bool) -> Select[Any]:
    """Built once per schema: every completion asks it."""
    task, dep = models.task, models.dependency
    child_ids = select(dep.child_id).where(traits.listed(dep.parent_id, "p_parents"))
    columns = (table_of(task),) if whole_rows else (task.id, task.queue, task.ignore_parent_failure)
    stmt = (
        select(*columns).where(task.id.in_(child_ids), task.status == Status.BLOCKED.value).order_by(task.id)
    )
    return traits.lock(stmt)


def _parents_of(tx: Tx, child_ids: list[str]) -> dict[str, list[tuple[str, Status]]]:
    """Every parent of each child, with its current status, in ``depends_on`` order."""
    task, dep = tx.models.task, tx.models.dependency
    found: defaultdict[str, list[tuple[str, Status]]] = defaultdict(list)
    for part in chunks(child_ids):
        stmt = (
            select(dep.child_id, dep.parent_id, task.status)
            .join(task, task.id == dep.parent_id)
            .where(dep.child_id.in_(part))
            .order_by(dep.child_id, dep.position)
        )
        for child_id, parent_id, status in tx.conn.execute(stmt):
            found[child_id].append((parent_id, Status(status)))
    return found


def _set(tx: Tx, task_id: str, status: Status, error: str | None) -> dict[str, Any]:
    """Write ``status`` (and, when final, its time and ``error``); the values written."""
    values: dict[str, Any] = status_values(status)
    if status.is_final:
        values.update(finished_at=tx.now, last_error=error)
    write_task(tx, task_id, values)
    return values
