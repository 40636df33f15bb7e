"""Dependency rules of the memory broker: status on arrival, wake-up and cascade cancel."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from taskgate.brokers.memory._record import Record
from taskgate.brokers.memory._table import TaskTable
from taskgate.task import Status

__all__ = ["arrival_status", "settle_children"]

_BROKEN = frozenset({Status.FAILED, Status.CANCELED})


def arrival_status(parents: Sequence[Record], ignore_parent_failure: bool) -> tuple[Status, str | None]:
    """The status a new task starts in, and the error to record when it starts canceled."""
    if not ignore_parent_failure:
        for parent in parents:
            if parent.status in _BROKEN:
                return Status.CANCELED, _parent_error(parent)
        if all(p.status is Status.COMPLETED for p in parents):
            return Status.PENDING, None
    elif all(p.status.is_final for p in parents):
        return Status.PENDING, None
    return Status.BLOCKED, None


def settle_children(table: TaskTable, root: Record, now: datetime) -> list[Record]:
    """After ``root`` became final: wake its ready children and cancel the broken ones, recursively.

    Returns every record that changed. Only blocked children move: a child with parents
    is blocked until all of them are final, so no other state can be waiting on ``root``.
    """
    if root.id not in table.children:
        return []  # most tasks have no children: no walk
    changed: list[Record] = []
    stack = [root]
    while stack:
        parent = stack.pop()
        for child_id in table.children.get(parent.id, ()):
            child = table.records[child_id]
            if child.status is not Status.BLOCKED:
                continue
            if parent.status is Status.COMPLETED or child.ignore_parent_failure:
                if _ready(table, child):
                    table.set_status(child, Status.PENDING)
                    changed.append(child)
                continue
            child.finished_at = now
            child.last_error = _parent_error(parent)
            table.set_status(child, Status.CANCELED)
            changed.append(child)
            stack.append(child)
    return changed


def _ready(table: TaskTable, child: Record) -> bool:
    parents = [table.records[p] for p in child.depends_on]
    status, _ = arrival_status(parents, child.ignore_parent_failure)
    return status is Status.PENDING


def _parent_error(parent: Record) -> str:
    return f"canceled because parent {parent.id} {parent.status.value}"
