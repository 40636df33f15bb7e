"""Read-only queries: get, list, history, counts, a queue's state, and "is anything due?"."""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any

from sqlalchemy import BindParameter, Integer, Label, Select, bindparam, false, func, select, true

from taskgate.brokers.params import QueueQuery, QueueState, QuotaUsage
from taskgate.brokers.sql import holds
from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.quotas import window_bounds
from taskgate.brokers.sql.rows import snapshot, snapshot_select, task_of
from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.models import Models
from taskgate.task import Filter, Status, Task

__all__ = ["anything_due", "counts", "get", "history", "list_tasks", "queue_state"]


def get(tx: Tx, task_id: str) -> Task:
    """The snapshot of ``task_id``."""
    return task_of(tx, task_id)


def list_tasks(tx: Tx, filter: Filter) -> list[Task]:
    """Tasks matching ``filter``, sorted by ``(created_at, id)``, then offset, then limit."""
    values = {
        "type": filter.type,
        "queue": filter.queue,
        "status": None if filter.status is None else filter.status.value,
        "business_key": filter.business_key,
        "group_name": filter.group,
    }
    matched = tuple(name for name, value in values.items() if value is not None)
    params: dict[str, Any] = {f"p_{name}": values[name] for name in matched}
    if filter.parent is not None:
        matched += ("parent",)
        params["p_parent"] = filter.parent
    if filter.offset:
        params["p_offset"] = filter.offset
    if filter.limit:
        params["p_limit"] = filter.limit
    stmt = _listing(tx.models, matched, bool(filter.offset), bool(filter.limit))
    return [snapshot(row) for row in tx.fetch(stmt, params)]


@functools.lru_cache(maxsize=128)
def _listing(models: Models, matched: tuple[str, ...], offset: bool, limit: bool) -> Select[Any]:
    """`list_tasks`'s statement for one shape of filter (the fields it matches, whether it
    skips or takes), built once per schema so it runs prepared."""
    task = table_of(models.task)
    fields = [name for name in matched if name != "parent"]
    stmt = snapshot_select(models).where(*(task.c[name] == bindparam(f"p_{name}") for name in fields))
    if "parent" in matched:  # the children of a task: through the edges' parent index
        edge = table_of(models.dependency)
        children = select(edge.c.child_id).where(edge.c.parent_id == bindparam("p_parent"))
        stmt = stmt.where(task.c.id.in_(children))
    stmt = stmt.order_by(task.c.created_at, task.c.id)
    if offset:
        stmt = stmt.offset(bindparam("p_offset", type_=Integer))
    if limit:
        stmt = stmt.limit(bindparam("p_limit", type_=Integer))
    return stmt


def history(tx: Tx, business_key: str) -> list[Task]:
    """Every execution of ``business_key``, oldest first, following the replay chain.

    Timestamps can tie (a coarse or frozen clock) and ids need not sort by age, but the chain
    ``replay_of`` links cannot lie, so the order comes from them.
    """
    found = [snapshot(row) for row in tx.fetch(_executions_of_key(tx.models), {"p_key": business_key})]
    by_parent = {t.replay_of: t for t in found}
    ids = {t.id for t in found}
    roots = sorted((t for t in found if t.replay_of not in ids), key=lambda t: (t.created_at, t.id))
    ordered: list[Task] = []
    for root in roots:
        current: Task | None = root
        while current is not None:
            ordered.append(current)
            current = by_parent.get(current.id)
    return ordered


def counts(tx: Tx) -> dict[str, dict[Status, int]]:
    """Counts by type and status from the (type, status) index; absent when zero."""
    result: dict[str, dict[Status, int]] = {}
    for row in tx.fetch(_counts(tx.models), {}):
        result.setdefault(row["type"], {})[Status(row["status"])] = int(row["n"])
    return result


def queue_state(tx: Tx, query: QueueQuery) -> QueueState:
    """Pending plus retrying tasks of ``query.queue`` (due or not), from the claim index, with
    a quota its current window's row, and the tasks ``query.unhandled`` names -- one statement."""
    queue, quota, unhandled = query.queue, query.quota, query.unhandled
    if unhandled is not None:
        return _with_unhandled(tx, query)
    if quota is None:
        (row,) = tx.fetch(_queue_and_hold(tx.models), {"p_queue": queue, "p_now": tx.now})
        return QueueState(int(row["n"]), held_until=row["held_until"])
    start, end = window_bounds(tx.now, quota.period)
    params = {"p_queue": queue, "p_key": quota.key, "p_start": start, "p_now": tx.now}
    (row,) = tx.fetch(_queue_and_window(tx.models), params)
    if row["used"] is not None:
        used = min(int(row["used"]), quota.limit)
    else:
        # No row: a window nothing was taken from yet, or -- with a newer row kept -- one the
        # clock stepped back into, from which claims grant nothing (`quotas.reserve_quota`).
        used = quota.limit if row["newer"] else 0
    usage = QuotaUsage(key=quota.key, limit=quota.limit, used=used, window_start=start, window_end=end)
    return QueueState(int(row["n"]), usage, row["held_until"])


def _with_unhandled(tx: Tx, query: QueueQuery) -> QueueState:
    """`queue_state` counting the tasks `Unhandled` names too (a range of the claim index)."""
    unhandled, quota = query.unhandled, query.quota
    assert unhandled is not None
    params: dict[str, Any] = {"p_queue": query.queue, "p_cutoff": tx.now - unhandled.after, "p_now": tx.now}
    if unhandled.handled:
        params["p_handled"] = list(unhandled.handled)
    if quota is not None:
        start, end = window_bounds(tx.now, quota.period)
        params.update(p_key=quota.key, p_start=start)
    statement = _state_and_unhandled(tx.models, tx.traits, quota is not None, bool(unhandled.handled))
    (row,) = tx.fetch(statement, params)
    usage = None
    if quota is not None:
        used = (
            min(int(row["used"]), quota.limit)
            if row["used"] is not None
            else quota.limit
            if row["newer"]
            else 0
        )
        usage = QuotaUsage(key=quota.key, limit=quota.limit, used=used, window_start=start, window_end=end)
    return QueueState(int(row["n"]), usage, row["held_until"], int(row["unhandled"]))


# The statements of the reads, built once per schema (so they run prepared).


@functools.lru_cache(maxsize=32)
def _state_and_unhandled(models: Models, traits: Traits, quota: bool, except_handled: bool) -> Select[Any]:
    """`_queue_and_hold` (or `_queue_and_window`) plus the count of ``p_queue``'s ready tasks due
    at or before ``p_cutoff`` -- of a type not in ``p_handled`` when ``except_handled``."""
    task = table_of(models.task)
    cutoff = bindparam("p_cutoff", type_=task.c.run_at.type)
    where = [task.c.queue == bindparam("p_queue"), task.c.ready == true(), task.c.run_at <= cutoff]
    if except_handled:
        # IS false, not NOT: MySQL's `listed` is a custom operator, which NOT cannot negate.
        where.append(traits.listed(task.c.type, "p_handled").is_(false()))
    overdue = select(func.count()).select_from(task).where(*where).scalar_subquery().label("unhandled")
    if quota:
        return _queue_and_window(models).add_columns(overdue)
    return _queue_and_hold(models).add_columns(overdue)


@functools.lru_cache(maxsize=32)
def _executions_of_key(models: Models) -> Select[Any]:
    return snapshot_select(models).where(models.task.business_key == bindparam("p_key"))


@functools.lru_cache(maxsize=32)
def _counts(models: Models) -> Select[Any]:
    task = table_of(models.task)
    return select(task.c.type, task.c.status, func.count().label("n")).group_by(task.c.type, task.c.status)


@functools.lru_cache(maxsize=32)
def _queue_length(models: Models) -> Select[Any]:
    task = table_of(models.task)
    ready = (task.c.queue == bindparam("p_queue"), task.c.ready == true())
    return select(func.count().label("n")).select_from(task).where(*ready)


@functools.lru_cache(maxsize=32)
def _queue_and_window(models: Models) -> Select[Any]:
    """The queue's length, the window row's ``used`` (NULL: no row) and whether a newer window
    row of the key is kept: three scalar subqueries in one SELECT, no FROM of its own."""
    window = table_of(models.quota_window)
    key: BindParameter[str] = bindparam("p_key")
    start = bindparam("p_start", type_=window.c.window_start.type)
    used = select(window.c.used).where(window.c.quota_key == key, window.c.window_start == start)
    newer = select(window.c.window_start).where(window.c.quota_key == key, window.c.window_start > start)
    return select(
        _queue_length(models).scalar_subquery().label("n"),
        used.scalar_subquery().label("used"),
        newer.exists().label("newer"),
        _hold(models),
    )


@functools.lru_cache(maxsize=32)
def _queue_and_hold(models: Models) -> Select[Any]:
    """The queue's length and its hold (NULL: not held), two scalar subqueries in one SELECT."""
    return select(_queue_length(models).scalar_subquery().label("n"), _hold(models))


def _hold(models: Models) -> Label[Any]:
    now = bindparam("p_now", type_=table_of(models.task).c.run_at.type)
    return holds.held_until_column(models, now).label("held_until")


def anything_due(tx: Tx, queues: Collection[str]) -> bool:
    """Whether some task of ``queues`` could be claimed now: one index probe per queue."""
    params = {"p_queues": list(queues), "p_now": tx.now}
    return tx.conn.execute(_due_probe(tx.models), params).first() is not None


@functools.lru_cache(maxsize=32)
def _due_probe(models: Models) -> Select[Any]:
    """`anything_due`'s statement, built once per schema (workers ask it while they idle)."""
    task = table_of(models.task)
    now = bindparam("p_now", type_=task.c.run_at.type)
    queues: BindParameter[str] = bindparam("p_queues", expanding=True)
    due = (task.c.queue.in_(queues), task.c.ready == true(), task.c.run_at <= now)
    return select(task.c.id).where(*due).limit(1)
