"""Back-pressure: a submit's count of a queue's waiting tasks, in the transaction of its insert.

For each limited queue a batch names (`Submit.limited`), in queue order, `check_room` locks the
queue's row of ``<prefix>queue_limits`` (the row `taskgate.brokers.sql.holds` and
`taskgate.brokers.sql.slots` use, made first if missing) until commit, so the submits of one
limited queue count one after the other whichever process makes them: two cannot both pass
at one below the limit. (SQLite's immediate write transaction serializes every writer anyway.)
Then ONE statement counts the queue's waiting tasks, each part stopping at the limit: pending
and retrying through the claim index (``queue, ready``: at most ``limit`` entries), blocked
through an index the planner picks -- the status index (``status, ...``, the queue checked on
each blocked row) or the claim index's queue prefix (the queue's rows, status checked on each).
No index has (queue, status): one would cost every insert and status change on MySQL and SQLite,
where submits without limits must cost what they did. So the blocked part reads up to every
blocked task of the store (children waiting for parents: few in most stores) or every task of
the queue, whichever the planner finds fewer -- until it has found ``limit`` of them.

A submit without limits sends none of this: it costs what it did.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from sqlalchemy import Integer, Select, String, bindparam, func, literal, literal_column, select, true

from taskgate.brokers.params import Submit
from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.errors import QueueFullError
from taskgate.models import Models
from taskgate.task import Status

__all__ = ["check_room"]

_QUEUE_ROW = ""  # ``group_name`` of the row that holds the queue's own limits


def check_room(tx: Tx, submit: Submit) -> None:
    """Lock and count each limited queue ``submit`` names; `QueueFullError` for the first one
    its batch would take past its limit (the caller's transaction then writes nothing)."""
    statements = _statements(tx.models, tx.traits)
    for queue, limit, adding in submit.limited():
        _lock_queue_row(tx, queue, statements)
        rows = tx.fetch(statements.count, {"p_queue": queue, "p_limit": limit})
        waiting = int(rows[0]["waiting"])
        if waiting + adding > limit:
            raise QueueFullError(queue, limit, waiting, adding)


def _lock_queue_row(tx: Tx, queue: str, statements: _Statements) -> None:
    params = {"p_queue": queue}
    if not tx.fetch(statements.lock_row, params):
        table = table_of(tx.models.queue_limit)
        tx.conn.execute(tx.traits.insert_if_missing(table, {"queue": queue, "group_name": _QUEUE_ROW}))
        tx.fetch(statements.lock_row, params)


@dataclasses.dataclass(frozen=True, slots=True)
class _Statements:
    lock_row: Select[Any]
    count: Select[Any]


@functools.lru_cache(maxsize=32)
def _statements(models: Models, traits: Traits) -> _Statements:
    limits, task = table_of(models.queue_limit), table_of(models.task)
    queue, limit = bindparam("p_queue", type_=String), bindparam("p_limit", type_=Integer)
    at_row = (limits.c.queue == queue, limits.c.group_name == literal_column("''"))
    ready = (
        select(literal(1).label("one"))
        .where(task.c.queue == queue, task.c.ready == true())
        .limit(limit)
        .subquery("ready_rows")
    )
    blocked = (
        select(literal(1).label("one"))
        .where(task.c.status == Status.BLOCKED.value, task.c.queue == queue)
        .limit(limit)
        .subquery("blocked_rows")
    )
    counted = (
        select(func.count()).select_from(ready).scalar_subquery()
        + select(func.count()).select_from(blocked).scalar_subquery()
    )
    return _Statements(
        lock_row=traits.lock(select(limits.c.queue).where(*at_row)),
        count=select(counted.label("waiting")),
    )
