"""`enqueue_and_claim`: store one task and, when nothing else of its queue is due, lease it at once.

A submit whose queue has an idle worker in the same process would otherwise commit the task,
wake that worker, and commit a claim of it: two transactions, each waiting for the server's
disk. Here the task is inserted already ``running`` with its lease, in the submit's own
transaction: on PostgreSQL one statement; elsewhere the look for other due tasks and the
insert are one statement, then the lease row and the commit.

It is leased only when no other task of its queue is due: a task waiting longer is never
overtaken. A due row another claimer holds counts as due too, so under a race the task is
stored pending and claimed the usual way -- never skipped, never claimed twice (it is new:
no one else can see it before the commit).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Insert,
    Integer,
    Select,
    String,
    Table,
    and_,
    bindparam,
    case,
    exists,
    false,
    func,
    insert,
    literal,
    select,
    true,
)
from sqlalchemy.exc import IntegrityError

from taskgate.brokers.base import Lease, NewTask
from taskgate.brokers.sql import create, leases
from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.retry import Conflict
from taskgate.brokers.sql.rows import snapshot, status_values
from taskgate.brokers.sql.tx import OneStatement, Tx, table_of
from taskgate.models import Models
from taskgate.task import Status, Task

__all__ = ["enqueue_and_claim", "enqueue_and_claim_in_one_statement", "enqueue_and_claim_plan"]


def enqueue_and_claim(
    tx: Tx, item: NewTask, lease_ttl: timedelta, *, check_ids: bool
) -> tuple[Task, Lease | None]:
    """Store ``item``; lease it too when it is due on arrival and nothing else of its queue is.

    The look for other due tasks and the insert are one statement (``INSERT … SELECT … WHERE
    NOT EXISTS``); when it inserts nothing, the task is stored pending the usual way.
    """
    now = tx.now
    if not item.depends_on and _due_on_arrival(item, now):
        create.check_free(tx, [item], check_ids=check_ids)
        check_ids = False  # just checked
        pending = create.new_row(item, now, Status.PENDING, None)
        claimed = {**pending, **_claimed_values(now)}
        params = {f"p_{name}": value for name, value in claimed.items()}
        try:
            inserted = tx.write(_insert_unless_due(tx.models), {**params, **_due_params(item, now)})
        except IntegrityError as exc:
            raise Conflict(f"task id {item.id!r} was taken concurrently: {exc.orig}") from exc
        if inserted:
            create.insert_keys(tx, [item])
            (lease,) = leases.lease_running(tx, [snapshot(claimed)], lease_ttl)
            return snapshot(pending), lease
    (stored,) = create.enqueue(tx, [item], check_ids=check_ids)
    return stored, None


def enqueue_and_claim_in_one_statement(
    tx: Tx, item: NewTask, lease_ttl: timedelta, channel: str
) -> tuple[Task, Lease | None] | None:
    """`enqueue_and_claim` of a task without parents or business key as ONE statement
    (``traits.dml_ctes``), run in autocommit; None when its id is taken (nothing changed).

    The statement decides pending or running itself, so the look-up of other due tasks, the
    insert, the lease and -- when the task stays pending -- the ``pg_notify`` of its queue are
    one round trip and one commit. A task not due on arrival goes the plain way.
    """
    return tx.one(enqueue_and_claim_plan(tx, item, lease_ttl, channel))


def enqueue_and_claim_plan(
    tx: Tx, item: NewTask, lease_ttl: timedelta, channel: str
) -> OneStatement[tuple[Task, Lease | None] | None]:
    """`enqueue_and_claim_in_one_statement`'s statement and the meaning of its rows."""
    now = tx.now
    if not _due_on_arrival(item, now):
        return create.enqueue_one_plan(tx, item, channel).then(
            lambda inserted: None if inserted is None else (snapshot(inserted), None)
        )
    pending = create.new_row(item, now, Status.PENDING, None)
    params: dict[str, Any] = {f"p_{name}": value for name, value in pending.items() if name not in _DECIDED}
    params.update(_due_params(item, now), p_expires_at=now + lease_ttl, p_channel=channel)

    def answer(rows: Sequence[Mapping[str, Any]]) -> tuple[Task, Lease | None]:
        (row,) = rows
        stored = snapshot(pending)
        if row["lease_token"] is None:
            tx.woken.add(item.queue)
            return stored, None
        running = snapshot(pending, _claimed_values(now))
        return stored, Lease(task=running, token=row["lease_token"], expires_at=params["p_expires_at"])

    statement = _insert_claimed_or_notify(tx.models, tx.traits)
    return OneStatement(statement, params, answer, none_on_conflict=True)


def _due_on_arrival(item: NewTask, now: datetime) -> bool:
    if item.run_at is not None:
        return item.run_at <= now
    return not item.delay


def _due_params(item: NewTask, now: datetime) -> dict[str, Any]:
    return {"p_queue": item.queue, "p_now": now}


def _claimed_values(now: datetime) -> dict[str, Any]:
    """What a claim writes into a pending row; the row's other values are the submit's."""
    return {**status_values(Status.RUNNING), "claims": 1, "started_at": now}


# The columns `_insert_claimed_or_notify` decides in SQL: pending or running.
_DECIDED = frozenset({"status", "ready", "claims", "started_at"})


def _due_in_queue(task: Table) -> ColumnElement[bool]:
    """A row of ``task`` that is a due task of queue ``p_queue`` at ``p_now`` (as a claim sees it)."""
    now = bindparam("p_now", type_=task.c.run_at.type)
    return and_(task.c.queue == bindparam("p_queue"), task.c.ready == true(), task.c.run_at <= now)


@functools.lru_cache(maxsize=32)
def _insert_unless_due(models: Models) -> Insert:
    """INSERT one task row (every column a ``p_<column>`` parameter) only when no task of its
    queue is due; built once per schema."""
    task = table_of(models.task)
    values = [bindparam(f"p_{column.name}", type_=column.type) for column in task.c]
    unless_due = select(*values).where(~exists().where(_due_in_queue(task)))
    return insert(task).from_select([column.name for column in task.c], unless_due)


@functools.lru_cache(maxsize=32)
def _insert_claimed_or_notify(models: Models, traits: Traits) -> Select[Any]:
    """INSERT the task running with its lease when nothing else of its queue is due, else
    pending and ``pg_notify`` its queue; built once per schema."""
    task, lease = table_of(models.task), table_of(models.lease)
    now = bindparam("p_now", type_=task.c.run_at.type)
    # MATERIALIZED: looked at once, not inlined into each column's CASE (four index scans).
    busy = select(exists().where(_due_in_queue(task)).label("due")).cte("busy").prefix_with("MATERIALIZED")
    pending, running = status_values(Status.PENDING), status_values(Status.RUNNING)
    decided = {
        "status": case(
            (busy.c.due, literal(pending["status"], String)), else_=literal(running["status"], String)
        ),
        "ready": busy.c.due,
        "claims": case((busy.c.due, literal(0, Integer)), else_=literal(1, Integer)),
        "started_at": case((busy.c.due, literal(None, DateTime(timezone=True))), else_=now),
    }
    values = [
        decided[column.name] if column.name in decided else bindparam(f"p_{column.name}", type_=column.type)
        for column in task.c
    ]
    inserted = (
        insert(task)
        .from_select([column.name for column in task.c], select(*values).select_from(busy))
        .returning(task.c.id, task.c.queue, task.c.ready)
        .cte("inserted")
    )
    expires_at = bindparam("p_expires_at", type_=lease.c.expires_at.type)
    new_lease = (
        insert(lease)
        .from_select(
            ["task_id", "token", "expires_at", "cancel_requested"],
            select(inserted.c.id, traits.random_token(), expires_at, false()).where(
                inserted.c.ready == false()
            ),
        )
        .returning(lease.c.token)
        .cte("new_lease")
    )
    notified = case(
        (inserted.c.ready, func.pg_notify(bindparam("p_channel", type_=String), inserted.c.queue)),
        else_=None,
    )
    token = select(new_lease.c.token).scalar_subquery()
    return select(token.label("lease_token"), notified.label("notified")).select_from(inserted)
