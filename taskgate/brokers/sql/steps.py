"""`Broker.step` on SQL: a handler's durable step in ``<prefix>steps``, keyed by (task, name).

A read is one statement: the task's row, joined with its step of that name if there is one (no
task row: `TaskNotFoundError`). A write locks the task's row shared -- so a prune, which skips
locked rows, cannot delete the task between the check and the insert -- then inserts the
result unless a row of that name exists (the dialect's insert-if-missing: ``ON CONFLICT DO
NOTHING``, ``INSERT IGNORE``), then reads what is stored: the first writer's result, whichever
of several racing writers that was.
"""

from __future__ import annotations

from sqlalchemy import and_, select

from taskgate.brokers.params import Step
from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.errors import TaskNotFoundError

__all__ = ["read_step", "store_step"]


def read_step(tx: Tx, step: Step) -> bytes | None:
    """The result stored for ``step``; None when none is."""
    task, steps = table_of(tx.models.task), table_of(tx.models.step)
    joined = task.outerjoin(steps, and_(steps.c.task_id == task.c.id, steps.c.name == step.name))
    row = tx.conn.execute(
        select(task.c.id, steps.c.result).select_from(joined).where(task.c.id == step.task_id)
    )
    found = row.first()
    if found is None:
        raise TaskNotFoundError(f"no task with id {step.task_id!r}")
    return None if found.result is None else bytes(found.result)


def store_step(tx: Tx, step: Step) -> bytes:
    """Store ``step.result`` unless a result of that name is stored; the one stored after."""
    assert step.result is not None, "a read is read_step's"
    task, steps = table_of(tx.models.task), table_of(tx.models.step)
    held = tx.conn.execute(tx.traits.lock_shared(select(task.c.id).where(task.c.id == step.task_id)))
    if held.first() is None:
        raise TaskNotFoundError(f"no task with id {step.task_id!r}")
    values = {"task_id": step.task_id, "name": step.name, "result": step.result, "created_at": tx.now}
    tx.conn.execute(tx.traits.insert_if_missing(steps, values))
    named = and_(steps.c.task_id == step.task_id, steps.c.name == step.name)
    return bytes(tx.conn.execute(select(steps.c.result).where(named)).scalar_one())
