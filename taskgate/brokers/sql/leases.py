"""Leases: claiming due tasks, renewing a lease, and reaping the expired ones.

Lock order everywhere: the task row first, then its lease row. Claim and reap skip rows
another transaction holds (``SKIP LOCKED``), so competing workers and reapers never wait
for each other and never take the same task twice.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    CTE,
    BindParameter,
    ColumnElement,
    Integer,
    Row,
    Select,
    Table,
    Update,
    bindparam,
    delete,
    false,
    insert,
    select,
    true,
    update,
)

from taskgate.brokers.base import Lease
from taskgate.brokers.params import Claimed, Compensation, Renewal
from taskgate.brokers.sql import holds
from taskgate.brokers.sql.create import store_new
from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.graph import settle_children
from taskgate.brokers.sql.rows import snapshot, status_values
from taskgate.brokers.sql.tx import OneStatement, Tx, table_of
from taskgate.errors import LeaseLostError, TaskNotFoundError
from taskgate.ids import new_id, new_tokens
from taskgate.models import Models
from taskgate.task import Status, Task

__all__ = [
    "CANCELED_ERROR",
    "claim",
    "claim_in_one_statement",
    "claim_order",
    "claim_params",
    "claim_plan",
    "due_order",
    "due_where",
    "heartbeat",
    "lease_lost_error",
    "lease_running",
    "locked_due_columns",
    "mark_locked_running",
    "one_statement_claim_parts",
    "reap",
    "typed_as",
]

CANCELED_ERROR = "canceled"


def claim(
    tx: Tx,
    queue: str,
    limit: int,
    lease_ttl: timedelta,
    *,
    durable: bool = True,
    types: tuple[str, ...] | None = None,
) -> list[Lease]:
    """Lease up to ``limit`` due tasks of ``queue`` (of ``types``; None: any, see `due_where`),
    in `claim_order`, inside the caller's transaction.

    With data-modifying CTEs (PostgreSQL) it is the one-statement claim, so lease
    rows have one INSERT shape there (the server draws the tokens). ``durable`` (the default):
    the commit waits for the server's disk, as it must when the transaction writes more than
    the claim and what it writes must not be undone by a crash (acks, quota units); False for
    a transaction whose every write a crash may undo together with the claim (see
    `_one_statement_claim`)."""
    if tx.traits.dml_ctes:
        return claim_in_one_statement(tx, queue, limit, lease_ttl, durable=durable, types=types).leases
    now = tx.now
    if tx.traits.update_returning:
        rows = tx.fetch(
            _mark_running(tx.models, tx.traits, typed_as(types)), claim_params(queue, limit, now, types)
        )
        snapshots = [snapshot(row) for row in sorted(rows, key=due_order)]
    else:
        snapshots = _lock_and_mark_running(tx, queue, limit, types)
    return lease_running(tx, snapshots, lease_ttl)


def lease_running(tx: Tx, tasks: list[Task], lease_ttl: timedelta) -> list[Lease]:
    """Insert a fresh lease for each of ``tasks`` (rows already marked running): their `Lease`s."""
    if not tasks:
        return []
    expires_at = tx.now + lease_ttl
    tokens = new_tokens(len(tasks))
    rows = [
        {"task_id": task.id, "token": token, "expires_at": expires_at, "cancel_requested": False}
        for task, token in zip(tasks, tokens, strict=True)
    ]
    tx.traits.insert_rows(tx, table_of(tx.models.lease), rows)
    return [
        Lease(task=task, token=token, expires_at=expires_at)
        for task, token in zip(tasks, tokens, strict=True)
    ]


def _lock_and_mark_running(tx: Tx, queue: str, limit: int, types: tuple[str, ...] | None) -> list[Task]:
    """Without ``UPDATE … RETURNING`` (MySQL): lock the due rows, update them, and build the
    snapshots from the locked values plus what the update wrote -- two statements. The lock
    reads only the columns the update does not write (PyMySQL parses each column of each row,
    and each column's description, in Python)."""
    lock_due, _ = _lock_then_mark(tx.models, tx.traits, typed_as(types))
    return mark_locked_running(tx, tx.fetch(lock_due, claim_params(queue, limit, tx.now, types)))


def mark_locked_running(tx: Tx, rows: Sequence[Mapping[str, Any]]) -> list[Task]:
    """Mark due rows this transaction locked running; their snapshots, built from the locked
    values (every column `locked_due_columns` names) plus what the update wrote."""
    if not rows:
        return []
    _, mark_running = _lock_then_mark(tx.models, tx.traits, 0)
    now = tx.now
    tx.write(mark_running, {"p_ids": [row["id"] for row in rows], "p_now": now})
    running = {**status_values(Status.RUNNING), "started_at": now}
    return [snapshot(row, {**running, "claims": row["claims"] + 1}) for row in rows]


def locked_due_columns(models: Models) -> list[Any]:
    """The columns a lock of due rows reads for `mark_locked_running`: those the update does
    not write, and ``claims``."""
    task = table_of(models.task)
    written = {**status_values(Status.RUNNING), "claims": 0, "started_at": None}
    return [column for column in task.c if column.name not in written or column.name == "claims"]


@functools.lru_cache(maxsize=32)
def _lock_then_mark(models: Models, traits: Traits, typed: int) -> tuple[Select[Any], Update]:
    """`_lock_and_mark_running`'s two statements, built once per schema."""
    task = table_of(models.task)
    now = bindparam("p_now", type_=task.c.run_at.type)
    values = {**status_values(Status.RUNNING), "claims": task.c.claims + 1, "started_at": now}
    due = (
        select(*locked_due_columns(models))
        .where(*due_where(task, traits, now, typed=typed))
        .where(holds.not_held(models, now))
        .order_by(*claim_order(task))
        .limit(bindparam("p_limit", type_=Integer))
    )
    mark = update(task).where(traits.listed(task.c.id, "p_ids")).values(values)
    return traits.lock(due, skip_locked=True), mark


def claim_in_one_statement(
    tx: Tx,
    queue: str,
    limit: int,
    lease_ttl: timedelta,
    *,
    durable: bool = False,
    types: tuple[str, ...] | None = None,
) -> Claimed:
    """`claim` as ONE statement (data-modifying CTEs, ``traits.dml_ctes``): run it in autocommit.

    Lock the due rows (``SKIP LOCKED``), mark them running and insert their leases, tokens drawn
    by the server's random generator -- atomic like any single statement, and one round trip
    instead of BEGIN, UPDATE, INSERT and COMMIT. The answer carries the queue's hold when it
    is held (the statement reads it: `holds.held_until_column`). ``durable``: the commit
    waits for the server's disk as every other transition does -- for a claim in a
    transaction that writes more than the claim (acks carried along), whose commit must not
    be lost in a server crash.
    """
    return tx.one(claim_plan(tx, queue, limit, lease_ttl, durable=durable, types=types))


def claim_plan(
    tx: Tx,
    queue: str,
    limit: int,
    lease_ttl: timedelta,
    *,
    durable: bool = False,
    types: tuple[str, ...] | None = None,
) -> OneStatement[Claimed]:
    """`claim_in_one_statement`'s statement and the meaning of its rows."""
    now = tx.now
    expires_at = now + lease_ttl
    params = {**claim_params(queue, limit, now, types), "p_expires_at": expires_at}

    def answer(rows: Sequence[Mapping[str, Any]]) -> Claimed:
        # One row at least: the hold's (its task columns NULL when nothing was claimed).
        leases = [
            Lease(task=snapshot(row), token=row["lease_token"], expires_at=expires_at)
            for row in sorted((row for row in rows if row["id"] is not None), key=due_order)
        ]
        return Claimed(leases, held_until=rows[0]["held_until"] if rows and not leases else None)

    return OneStatement(_one_statement_claim(tx.models, tx.traits, durable, typed_as(types)), params, answer)


def claim_params(
    queue: str, limit: int, now: datetime, types: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """The parameters of a claim statement; ``types`` goes with one built ``typed_as(types)``."""
    # Parameter names must not be column names: in an UPDATE those would mean "SET this column".
    params: dict[str, Any] = {"p_queue": queue, "p_limit": limit, "p_now": now}
    if types is not None:
        if len(types) == 1:
            params["p_type"] = types[0]
        else:
            params["p_types"] = list(types)
    return params


def typed_as(types: tuple[str, ...] | None) -> int:
    """How a claim statement for ``types`` is built (`due_where`): 0 for any type, 1 for one
    (a plain parameter), 2 for several (a list)."""
    return 0 if types is None else min(len(types), 2)


def due_where(
    task: Table, traits: Traits, now: ColumnElement[Any], *, typed: int
) -> list[ColumnElement[bool]]:
    """The conditions of a due task of ``p_queue`` -- of type ``p_type`` when ``typed`` is 1,
    of one of the types in list parameter ``p_types`` when 2 (`Claim.types`; one statement
    text for any number of them), of any type when 0.

    A claim asks for the types its process handles, usually one per queue: that one is a
    plain parameter, which every driver binds as cheaply as the queue's name. The claim index
    (queue, ready, priority DESC, run_at, id) serves the order (`claim_order`); the type is
    checked on the rows it passes, so due tasks of other types ahead cost a row visit each
    (the index has no type column).
    """
    where = [task.c.queue == bindparam("p_queue"), task.c.ready == true(), task.c.run_at <= now]
    if typed == 1:
        where.append(task.c.type == bindparam("p_type"))
    elif typed:
        where.append(traits.listed(task.c.type, "p_types"))
    return where


@functools.lru_cache(maxsize=32)
def _mark_running(models: Models, traits: Traits, typed: int) -> Update:
    """UPDATE up to ``p_limit`` due rows (locked, ``SKIP LOCKED``) to running, RETURNING them."""
    return _mark_running_up_to(models, traits, bindparam("p_limit", type_=Integer), typed=typed)


def _mark_running_up_to(models: Models, traits: Traits, limit: ColumnElement[int], *, typed: int) -> Update:
    task = table_of(models.task)
    now = bindparam("p_now", type_=task.c.run_at.type)
    due = (
        select(task.c.id)
        .where(*due_where(task, traits, now, typed=typed))
        .where(holds.not_held(models, now))
        .order_by(*claim_order(task))
        .limit(limit)
    )
    locked = traits.lock(due, skip_locked=True).scalar_subquery()
    values = {**status_values(Status.RUNNING), "claims": task.c.claims + 1, "started_at": now}
    return update(task).where(task.c.id.in_(locked)).values(values).returning(*task.c)


@functools.lru_cache(maxsize=32)
def _one_statement_claim(models: Models, traits: Traits, durable: bool, typed: int) -> Select[Any]:
    """`_mark_running` and the INSERT of the leases, as data-modifying CTEs.

    Unless ``durable``, the commit does not wait for the server's disk
    (``commit_without_flush_wait``, which holds for the whole transaction): a claim
    lost in a server crash puts its tasks back as they were before it -- pending, to be run
    again -- and loses nothing, while the claim is on the path between a finished handler and
    the next start. Every other transition still waits, and its flush covers earlier claims.
    Claims that spend quota keep waiting: a lost claim would hand its quota units back. So do
    claims in a transaction that also wrote acks (``durable``): a crash would undo those acks,
    and their tasks, completed, would run again.
    """
    limit = bindparam("p_limit", type_=Integer)
    claimed, new_leases = one_statement_claim_parts(models, traits, limit, typed=typed)
    columns: list[Any] = [claimed, new_leases.c.token.label("lease_token")]
    no_flush_wait = None if durable else traits.commit_without_flush_wait()
    if no_flush_wait is not None:
        columns.append(no_flush_wait.label("no_flush_wait"))
    # The claimed rows joined to ONE row of the queue's hold, so a held queue's claim answers
    # its hold in the same statement (`holds`).
    hold = select(holds.held_until_column(models, _now(models)).label("held_until")).subquery("hold")
    with_leases = claimed.join(new_leases, new_leases.c.task_id == claimed.c.id)
    return select(hold.c.held_until, *columns).select_from(hold.outerjoin(with_leases, true()))


def _now(models: Models) -> BindParameter[Any]:
    return bindparam("p_now", type_=table_of(models.task).c.run_at.type)


def one_statement_claim_parts(
    models: Models, traits: Traits, limit: ColumnElement[int], *, typed: int = 0
) -> tuple[CTE, CTE]:
    """The CTEs ``claimed`` (up to ``limit`` due tasks marked running, of the types `due_where`
    says for ``typed``) and ``new_leases`` (their leases, tokens drawn by the server), for statements
    built around a claim."""
    lease = table_of(models.lease)
    claimed = _mark_running_up_to(models, traits, limit, typed=typed).cte("claimed")
    expires_at = bindparam("p_expires_at", type_=lease.c.expires_at.type)
    new_leases = (
        insert(lease)
        .from_select(
            ["task_id", "token", "expires_at", "cancel_requested"],
            select(claimed.c.id, traits.random_token(), expires_at, false()),
        )
        .returning(lease.c.task_id, lease.c.token)
        .cte("new_leases")
    )
    return claimed, new_leases


def claim_order(task: Table) -> tuple[ColumnElement[Any], ...]:
    """The order due tasks are claimed in: highest priority first, then oldest due, then id --
    the order of the claim index (queue, ready, priority DESC, run_at, id)."""
    return (task.c.priority.desc(), task.c.run_at, task.c.id)


def due_order(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """`claim_order` as a sort key of claimed rows (a statement returns them in no order)."""
    return (-row["priority"], row["run_at"], row["id"])


def heartbeat(tx: Tx, task_id: str, token: str, lease_ttl: timedelta, progress: str | None = None) -> Renewal:
    """Extend the lease (storing ``progress`` on the task when given); an expired lease no
    reaper took back yet can still be renewed."""
    lease = tx.models.lease
    expires_at = tx.now + lease_ttl
    where = (lease.task_id == task_id, lease.token == token)
    # Only the narrow lease row is written; the wide task row is not touched by heartbeats
    # (but by a progress report, after the lease row's update proved the token).
    if tx.conn.execute(update(lease).where(*where).values(expires_at=expires_at)).rowcount == 0:
        raise lease_lost_error(tx, task_id)
    if progress is not None:
        task = tx.models.task
        tx.conn.execute(update(task).where(task.id == task_id).values(progress=progress))
    cancel_requested = tx.conn.execute(select(lease.cancel_requested).where(*where)).scalar()
    return Renewal(expires_at=expires_at, cancel_requested=bool(cancel_requested))


def lease_lost_error(tx: Tx, task_id: str) -> LeaseLostError | TaskNotFoundError:
    """The error for a token that is not ``task_id``'s lease: not found, or lease lost."""
    task = tx.models.task
    status = tx.conn.execute(select(task.status).where(task.id == task_id)).scalar()
    if status is None:
        return TaskNotFoundError(f"no task with id {task_id!r}")
    if status != Status.RUNNING.value:
        return LeaseLostError(f"task {task_id} is {status}; the lease is gone")
    return LeaseLostError(f"task {task_id} is held under another lease")


def reap(
    tx: Tx, lease_lost_max: int, limit: int, compensations: Mapping[str, Compensation] | None = None
) -> list[Task]:
    """Take back up to ``limit`` tasks whose lease ended, earliest expiry first."""
    task, lease = tx.models.task, tx.models.lease
    expired = (
        select(table_of(task), lease.cancel_requested)
        .join(lease, lease.task_id == task.id)
        .where(lease.expires_at <= tx.now)
        .order_by(lease.expires_at, lease.task_id)
        .limit(limit)
    )
    # Locks the task rows (and, on PostgreSQL/MySQL, the lease rows too); a task another
    # reaper or its worker holds right now is skipped, so a lease is counted once.
    rows = tx.conn.execute(tx.traits.lock(expired, skip_locked=True)).all()
    return [_reap_one(tx, row, lease_lost_max, compensations or {}) for row in rows]


def _reap_one(tx: Tx, row: Row[Any], lease_lost_max: int, compensations: Mapping[str, Compensation]) -> Task:
    task, lease = tx.models.task, tx.models.lease
    tx.conn.execute(delete(lease).where(lease.task_id == row.id))
    count = row.lease_lost + 1
    values: dict[str, Any] = {"lease_lost": count}
    if row.cancel_requested:
        values.update(status_values(Status.CANCELED), last_error=CANCELED_ERROR, finished_at=tx.now)
    elif count >= lease_lost_max:
        error = f"lease lost {count} times (lease_lost_max={lease_lost_max})"
        values.update(status_values(Status.FAILED), last_error=error, finished_at=tx.now)
    else:
        values.update(status_values(Status.PENDING), run_at=tx.now)
        tx.woken.add(row.queue)
    tx.conn.execute(update(task).where(task.id == row.id).values(values))
    status = Status(values["status"])
    if status.is_final:
        settle_children(tx, [(row.id, status)])
    compensation = compensations.get(row.type) if status is Status.FAILED else None
    if compensation is not None:  # in the transaction that failed the task
        store_new(tx, [compensation.task(row.id, new_id())], check_ids=False)
    return snapshot(row, {**values, "cancel_requested": False})
