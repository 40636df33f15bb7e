"""Task rows as `Task` snapshots, and the column values every status change writes."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Row, Select, Update, bindparam, select, update

from taskgate.brokers.sql.tx import OneStatement, Tx, table_of
from taskgate.errors import TaskNotFoundError
from taskgate.models import Models
from taskgate.task import STATUS_BY_VALUE, Status, Task, task_from_fields

__all__ = [
    "READY",
    "chunks",
    "decode_parents",
    "encode_parents",
    "snapshot",
    "snapshot_select",
    "status_values",
    "task_of",
    "task_of_plan",
    "timeout_ms",
    "write_task",
]

READY = frozenset({Status.PENDING, Status.RETRYING})

# Bound parameters per IN list: far below every database's limit (SQLite's is 32766).
_CHUNK = 500
_NO_PARENTS = "[]"  # most tasks have no parents: no JSON round trip for them
_MILLISECOND = timedelta(milliseconds=1)


def status_values(status: Status) -> dict[str, Any]:
    """The column values that put a row in ``status``; the only way a status is written.

    ``ready`` must follow ``status`` exactly, so every transition takes both from here.
    """
    return {"status": status.value, "ready": status in READY}


def encode_parents(depends_on: Sequence[str]) -> str:
    """The stored form of ``depends_on`` (a JSON list, order kept)."""
    if not depends_on:
        return _NO_PARENTS
    return json.dumps(list(depends_on), separators=(",", ":"))


def decode_parents(stored: str) -> tuple[str, ...]:
    """``depends_on`` from its stored form."""
    return () if stored == _NO_PARENTS else tuple(json.loads(stored))


def timeout_ms(timeout: timedelta | None) -> int | None:
    """The stored form of a task's ``timeout``: whole milliseconds (`NewTask` rounded it)."""
    return None if timeout is None else timeout // _MILLISECOND


def _timeout(stored: int | None) -> timedelta | None:
    return None if stored is None else timedelta(milliseconds=stored)


def chunks(items: Sequence[str], size: int = _CHUNK) -> Iterable[Sequence[str]]:
    """``items`` in slices small enough for one IN list."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def snapshot_select(models: Models) -> Select[Any]:
    """SELECT of task rows plus the cancel mark of their lease, if any."""
    task, lease = models.task, models.lease
    return select(table_of(task), lease.cancel_requested).outerjoin(lease, lease.task_id == task.id)


def task_of(tx: Tx, task_id: str) -> Task:
    """The snapshot of ``task_id`` (one statement, built once per schema); raises
    `TaskNotFoundError`."""
    return tx.one(task_of_plan(tx, task_id))


def task_of_plan(tx: Tx, task_id: str) -> OneStatement[Task]:
    """`task_of`'s statement and the meaning of its rows."""

    def answer(found: Sequence[Mapping[str, Any]]) -> Task:
        if not found:
            raise TaskNotFoundError(f"no task with id {task_id!r}")
        return snapshot(found[0])

    return OneStatement(_one_task(tx.models), {"p_id": task_id}, answer)


def write_task(tx: Tx, task_id: str, values: Mapping[str, Any]) -> None:
    """UPDATE the task ``task_id`` with ``values`` (column -> value): a statement built once per
    schema and set of columns, so it runs prepared like the hot transitions' statements."""
    params = {f"v_{column}": value for column, value in values.items()}
    params["p_id"] = task_id
    tx.write(_task_update(tx.models, tuple(sorted(values))), params)


@functools.lru_cache(maxsize=128)
def _task_update(models: Models, columns: tuple[str, ...]) -> Update:
    task = table_of(models.task)
    values = {column: bindparam(f"v_{column}", type_=task.c[column].type) for column in columns}
    return update(task).where(task.c.id == bindparam("p_id")).values(values)


@functools.lru_cache(maxsize=32)
def _one_task(models: Models) -> Select[Any]:
    return snapshot_select(models).where(models.task.id == bindparam("p_id"))


def snapshot(row: Row[Any] | Mapping[str, Any], changes: Mapping[str, Any] | None = None) -> Task:
    """A snapshot of a task row (with ``changes`` applied: values this transaction just wrote).

    The row may carry ``cancel_requested`` from the lease join; absent means no lease mark.
    """
    values = row._mapping if isinstance(row, Row) else row
    if changes:
        values = {**values, **changes}
    return task_from_fields(
        {
            "id": values["id"],
            "type": values["type"],
            "queue": values["queue"],
            "payload": values["payload"],
            "status": STATUS_BY_VALUE[values["status"]],
            "created_at": values["created_at"],
            "run_at": values["run_at"],
            "result": values["result"],
            "last_error": values["last_error"],
            "attempts": values["attempts"],
            "max_retry": values["max_retry"],
            "throttled": values["throttled"],
            "lease_lost": values["lease_lost"],
            "claims": values["claims"],
            "depends_on": decode_parents(values["depends_on"]),
            "ignore_parent_failure": bool(values["ignore_parent_failure"]),
            "business_key": values["business_key"],
            "replay_of": values["replay_of"],
            "started_at": values["started_at"],
            "finished_at": values["finished_at"],
            "timeout": _timeout(values["timeout_ms"]),
            "group": values["group_name"],
            "last_traceback": values["last_traceback"],
            "progress_json": values["progress"],
            "trace_context": values["trace_context"],
            "priority": values["priority"],
            "cancel_requested": bool(values.get("cancel_requested")),
        }
    )
