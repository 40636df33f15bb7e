"""Creating executions: `store_new` (a batch, all-or-nothing), a single task in one statement
where the dialect can (`enqueue_one_in_one_statement`), and `replay`.

Each table's rows go in by the dialect's one INSERT shape (`Traits.insert_rows`): on
PostgreSQL the single task's statement is built around that same INSERT (`row_insert`).

Uniqueness races are settled by constraints, not by reading first: the business-keys table's
primary key lets exactly one of many racing submitters of a key win, and the unique
``replay_of`` lets exactly one replay of an execution win. The loser's transaction rolls back
and runs again (`Conflict`), and its checks then name the winner.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Integer,
    Select,
    String,
    and_,
    bindparam,
    exists,
    func,
    insert,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError

from taskgate.brokers.base import UNSET, NewTask, Unset
from taskgate.brokers.params import Replay, Submit
from taskgate.brokers.sql import backpressure
from taskgate.brokers.sql.dialects import Traits, ValueLimit, row_insert, row_params
from taskgate.brokers.sql.graph import arrival_status
from taskgate.brokers.sql.retry import Conflict
from taskgate.brokers.sql.rows import chunks, encode_parents, snapshot, status_values, task_of, timeout_ms
from taskgate.brokers.sql.tx import OneStatement, Tx, table_of
from taskgate.clock import utc
from taskgate.errors import (
    AlreadyReplayedError,
    CompletedNotAllowedError,
    ReplayNotFinalError,
    TaskExistsError,
    TaskNotFoundError,
)
from taskgate.models import Models
from taskgate.task import Status, Task

__all__ = [
    "check_value_size",
    "enqueue_one_in_one_statement",
    "enqueue_one_plan",
    "new_row",
    "replay",
    "store_new",
]


def check_value_size(value: bytes | None, limit: ValueLimit | None, *, what: str) -> None:
    """Refuse, before anything is sent, a payload/result whose statement the server would
    refuse: MySQL's ``max_allowed_packet`` bounds the statement, where the value travels
    encoded at two characters a byte (`MySQLTraits.value_limit`)."""
    if value is not None and limit is not None and len(value) > limit.largest:
        raise ValueError(
            f"{what} is {len(value)} bytes, about {2 * len(value)} once encoded in the statement "
            f"(two characters a byte); this MySQL server's max_allowed_packet is {limit.packet} "
            f"bytes, which takes values of at most {limit.largest} bytes (raise "
            "max_allowed_packet on the server, or store large values elsewhere and pass a reference)"
        )


def store_new(
    tx: Tx, items: Sequence[NewTask], *, check_ids: bool = True, room: Submit | None = None
) -> list[dict[str, Any]]:
    """Insert ``items`` (already validated in themselves) after checking them against the store;
    the rows inserted, in order.

    ``check_ids=False`` skips the look-up of ids in use: fresh ULIDs almost never are, and the
    primary key still refuses one that is (`Conflict`); the caller then runs the transaction
    again WITH the check, which names the id in a `ValueError`. ``room``: the submit whose
    ``max_pending`` to check (`backpressure.check_room`), after the parents are locked -- the
    order a claim's acks take the same locks in -- and before anything is written.
    """
    _check_batch(items)
    _check_free(tx, items, check_ids=check_ids)
    parents = _parent_statuses(tx, items)
    if room is not None and room.max_pending:
        backpressure.check_room(tx, room)
    rows = []
    alike: tuple[tuple[Any, ...], dict[str, Any]] | None = None  # the last parentless row
    for item in items:
        if item.depends_on:
            known = [(p, parents[p]) for p in item.depends_on]
            status, error = arrival_status(known, item.ignore_parent_failure)
            parents[item.id] = status
            rows.append(new_row(item, tx.now, status, error))
            continue
        # Without parents a task arrives pending, and the rows of a batch's parentless tasks
        # differ only in id, payload and business key: copying one is a third of building it.
        parents[item.id] = Status.PENDING
        shape = (
            item.type,
            item.queue,
            item.max_retry,
            item.run_at,
            item.delay,
            item.ignore_parent_failure,
            item.timeout,
            item.group,
            item.trace_context,
            item.priority,
        )
        if alike is None or alike[0] != shape:
            alike = shape, new_row(item, tx.now, Status.PENDING, None)
            rows.append(alike[1])
        else:
            varying = {"id": item.id, "payload": item.payload, "business_key": item.business_key}
            rows.append({**alike[1], **varying})
    _insert(tx, rows, items)
    return rows


def _check_free(tx: Tx, items: Sequence[NewTask], *, check_ids: bool) -> None:
    """`store_new`'s checks of ids (``check_ids``) and business keys against the store."""
    if check_ids:
        _check_ids_free(tx, [item.id for item in items])
    _check_keys_free(tx, [item.business_key for item in items if item.business_key is not None])


def enqueue_one_in_one_statement(tx: Tx, item: NewTask, channel: str) -> dict[str, Any] | None:
    """`store_new` of ONE task as one statement (``traits.dml_ctes``); the row inserted.

    The task row, its business-key row if it has a key, and the ``pg_notify`` of its queue are
    one statement, run in autocommit: one round trip where the transaction takes four to six.
    A task with parents goes in the same way when every parent exists and none is final yet
    (a pipeline submitting its steps ahead): it arrives blocked, its edges with it, and the
    statement share-locks the parents, as `store_new` does, until the child is committed.
    None when that does not hold, or the id or the key is taken (the statement changed
    nothing): the caller then runs `store_new`, whose checks name what was wrong.
    """
    return tx.one(enqueue_one_plan(tx, item, channel))


def enqueue_one_plan(tx: Tx, item: NewTask, channel: str) -> OneStatement[dict[str, Any] | None]:
    """`enqueue_one_in_one_statement`'s statement and the meaning of its rows."""
    parents = tuple(dict.fromkeys(item.depends_on))
    row = new_row(item, tx.now, Status.BLOCKED if parents else Status.PENDING, None)
    params = row_params(row)
    if item.business_key is not None:
        params.update(
            row_params({"business_key": item.business_key, "execution_id": item.id}, prefix="p_key_")
        )
    if parents:
        params.update(
            p_parents=list(parents),
            p_parent_count=len(parents),
            p_edges=list(item.depends_on),
            p_positions=list(range(len(item.depends_on))),
        )
    else:
        params["p_channel"] = channel

    def answer(inserted: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        if not inserted:
            return None  # a parent is missing or final
        if not parents:
            tx.woken.add(item.queue)
        return row

    statement = _insert_one(tx.models, tx.traits, keyed=item.business_key is not None, child=bool(parents))
    return OneStatement(statement, params, answer, none_on_conflict=True)


@functools.lru_cache(maxsize=32)
def _insert_one(models: Models, traits: Traits, *, keyed: bool, child: bool) -> Select[Any]:
    """One task row (``keyed``: and its business-key row; ``child``: blocked, with its edges,
    only if its parents all exist and none is final) and, for a task without parents, the
    ``pg_notify`` of its queue; one row back when the task went in. The task and key rows go
    in by their tables' one INSERT shape (`row_insert`), the key's only where the task's did.
    Built once per schema. (A data-modifying WITH runs whole whether or not the statement
    reads it.)"""
    task, dependency = table_of(models.task), table_of(models.dependency)
    columns = tuple(column.name for column in task.c)
    if not child:
        inserted = row_insert(task, columns).returning(task.c.id, task.c.queue).cte("inserted")
        answer = select(func.pg_notify(bindparam("p_channel", type_=String), inserted.c.queue))
    else:
        parents = traits.lock_shared(
            select(task.c.id, task.c.status).where(traits.listed(task.c.id, "p_parents")).order_by(task.c.id)
        ).cte("parents")
        # One bind per status, each a constant (an expanding IN could not be prepared).
        final = [literal(status.value) for status in Status if status.is_final]
        all_waiting = and_(
            select(func.count()).select_from(parents).scalar_subquery()
            == bindparam("p_parent_count", type_=Integer),
            ~exists().where(parents.c.status.in_(final)),
        )
        inserted = row_insert(task, columns, where=all_waiting).returning(task.c.id).cte("inserted")
        edges = traits.unnest(
            "edges",
            position=("p_positions", dependency.c.position.type),
            parent_id=("p_edges", dependency.c.parent_id.type),
        )
        edge_rows = select(inserted.c.id, edges.c.position, edges.c.parent_id).select_from(
            inserted.join(edges, true())
        )
        stored_edges = insert(dependency).from_select(["child_id", "position", "parent_id"], edge_rows)
        answer = select(inserted.c.id).add_cte(stored_edges.returning(dependency.c.child_id).cte("edges_in"))
    if keyed:
        key = table_of(models.business_key)
        went_in = exists(select(inserted.c.id))
        claimed_key = row_insert(key, ("business_key", "execution_id"), prefix="p_key_", where=went_in)
        answer = answer.add_cte(claimed_key.returning(key.c.business_key).cte("keyed"))
    return answer


def replay(tx: Tx, replay: Replay) -> Task:
    """Create the executions ``replay`` asks for (`Replay`: the first and its descendants);
    checks in the memory broker's order, all before anything is written; the first's snapshot."""
    runs = [(replay.execution_id, replay.new_id), *replay.descendants]
    olds = [_replayable(tx, old_id, replay.allow_completed) for old_id, _ in runs]
    _check_ids_free(tx, [new_id for _, new_id in runs])
    new_ids = replay.new_ids
    later = set(new_ids.values())
    made: dict[str, Status] = {}  # new executions written so far -> their status on arrival
    snapshots: list[Task] = []
    for n, (old, (_, new_id)) in enumerate(zip(olds, runs, strict=True)):
        depends_on = tuple(new_ids.get(p, p) for p in old.depends_on)
        stored = [p for p in depends_on if p not in made]
        if later.intersection(stored):
            raise ValueError(f"Replay.descendants lists {old.id}'s execution before a parent of it")
        statuses = {**_locked_statuses(tx, stored), **made}
        status, error = arrival_status([(p, statuses[p]) for p in depends_on], old.ignore_parent_failure)
        payload = replay.payload if n == 0 else UNSET
        row = _replay_row(old, new_id, tx.now, payload, status, error, depends_on)
        _insert_replay(tx, row, old, depends_on)
        made[new_id] = status
        snapshots.append(snapshot(row))
    return snapshots[0]


def _replayable(tx: Tx, old_id: str, allow_completed: bool) -> Task:
    """The stored execution ``old_id``, checked to be one a replay may re-run."""
    old = task_of(tx, old_id)
    if not old.status.is_final:
        raise ReplayNotFinalError(f"execution {old.id} is {old.status.value}, not final")
    task = tx.models.task
    newer = tx.conn.execute(select(task.id).where(task.replay_of == old.id)).scalar()
    if newer is not None:
        raise AlreadyReplayedError(f"execution {old.id} was already replayed by {newer}")
    if old.status is Status.COMPLETED and not allow_completed:
        raise CompletedNotAllowedError(f"execution {old.id} completed; pass allow_completed=True")
    return old


def _check_batch(items: Sequence[NewTask]) -> None:
    ids: set[str] = set()
    keys: set[str] = set()
    for item in items:
        if item.id in ids:
            raise ValueError(f"task id {item.id!r} is already in use")
        ids.add(item.id)
        if item.business_key is not None:
            if item.business_key in keys:
                raise ValueError(f"business_key {item.business_key!r} appears twice in one enqueue batch")
            keys.add(item.business_key)


def _check_ids_free(tx: Tx, ids: Sequence[str]) -> None:
    stmt = _id_in_use(tx.models, tx.traits)
    for part in chunks(ids):
        used = tx.conn.execute(stmt, {"p_ids": list(part)}).scalar()
        if used is not None:
            raise ValueError(f"task id {used!r} is already in use")


def _check_keys_free(tx: Tx, keys: Sequence[str]) -> None:
    stmt = _key_in_use(tx.models, tx.traits)
    for part in chunks(keys):
        used = tx.conn.execute(stmt, {"p_keys": list(part)}).first()
        if used is not None:
            raise TaskExistsError(used.business_key, used.id, Status(used.status))


# The look-ups every submit with a business key or parents makes, built once per schema.


@functools.lru_cache(maxsize=32)
def _id_in_use(models: Models, traits: Traits) -> Select[str]:
    task = models.task
    return select(task.id).where(traits.listed(task.id, "p_ids")).limit(1)


@functools.lru_cache(maxsize=32)
def _key_in_use(models: Models, traits: Traits) -> Select[str, str, str]:
    key, task = models.business_key, models.task
    return (
        select(key.business_key, task.id, task.status)
        .join(task, task.id == key.execution_id)
        .where(traits.listed(key.business_key, "p_keys"))
        .limit(1)
    )


@functools.lru_cache(maxsize=32)
def _statuses_locked(models: Models, traits: Traits) -> Select[str, str]:
    task = models.task
    return traits.lock_shared(
        select(task.id, task.status).where(traits.listed(task.id, "p_ids")).order_by(task.id)
    )


def _parent_statuses(tx: Tx, items: Sequence[NewTask]) -> dict[str, Status]:
    """Statuses of the parents named by ``items`` that are already stored (locked, see below)."""
    batch = {item.id for item in items}
    stored = sorted({p for item in items for p in item.depends_on if p not in batch})
    statuses = _locked_statuses(tx, stored)
    earlier: set[str] = set()
    for item in items:
        for parent in item.depends_on:
            if parent in batch and parent not in earlier:
                raise TaskNotFoundError(f"parent task {parent!r} does not exist (yet) in this batch")
        earlier.add(item.id)
    return statuses


def _locked_statuses(tx: Tx, ids: Sequence[str]) -> dict[str, Status]:
    """Statuses of ``ids``, share-locked so none becomes final before our children are stored.

    Without the lock, a parent finishing concurrently would look for children, find none
    (ours are not committed yet), and leave ours blocked forever.
    """
    stmt = _statuses_locked(tx.models, tx.traits)
    found: dict[str, Status] = {}
    for part in chunks(sorted(set(ids))):
        found.update((row.id, Status(row.status)) for row in tx.conn.execute(stmt, {"p_ids": list(part)}))
    for task_id in ids:
        if task_id not in found:
            raise TaskNotFoundError(f"parent task {task_id!r} does not exist")
    return found


def new_row(item: NewTask, now: datetime, status: Status, error: str | None) -> dict[str, Any]:
    run_at = utc(item.run_at) if item.run_at is not None else now + (item.delay or timedelta(0))
    return _row(
        id=item.id,
        type=item.type,
        queue=item.queue,
        payload=item.payload,
        max_retry=item.max_retry,
        ignore_parent_failure=item.ignore_parent_failure,
        depends_on=encode_parents(item.depends_on),
        business_key=item.business_key,
        replay_of=None,
        timeout_ms=timeout_ms(item.timeout),
        group_name=item.group,
        created_at=now,
        run_at=run_at,
        status=status,
        error=error,
        trace_context=item.trace_context,
        priority=item.priority,
    )


def _replay_row(
    old: Task,
    new_id: str,
    now: datetime,
    payload: bytes | Unset | None,
    status: Status,
    error: str | None,
    depends_on: tuple[str, ...],
) -> dict[str, Any]:
    return _row(
        id=new_id,
        type=old.type,
        queue=old.queue,
        payload=old.payload if isinstance(payload, Unset) else payload,
        max_retry=old.max_retry,
        ignore_parent_failure=old.ignore_parent_failure,
        depends_on=encode_parents(depends_on),
        business_key=old.business_key,
        replay_of=old.id,
        timeout_ms=timeout_ms(old.timeout),
        group_name=old.group,
        created_at=now,
        run_at=now,
        status=status,
        error=error,
        priority=old.priority,
    )


def _row(
    *,
    created_at: datetime,
    status: Status,
    error: str | None,
    timeout_ms: int | None,
    trace_context: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    counters = {"attempts": 0, "throttled": 0, "lease_lost": 0, "claims": 0}
    return {
        **fields,
        **counters,
        **status_values(status),
        "created_at": created_at,
        "started_at": None,
        "finished_at": created_at if status.is_final else None,
        "result": None,
        "last_error": error,
        "timeout_ms": timeout_ms,
        # Every column has a value: each dialect's one INSERT shape binds them all.
        "last_traceback": None,
        "progress": None,
        "trace_context": trace_context,
    }


def _insert(tx: Tx, rows: list[dict[str, Any]], items: Sequence[NewTask]) -> None:
    m = tx.models
    edges = [
        {"child_id": item.id, "position": n, "parent_id": parent}
        for item in items
        for n, parent in enumerate(item.depends_on)
    ]
    keys = [
        {"business_key": i.business_key, "execution_id": i.id} for i in items if i.business_key is not None
    ]
    try:
        tx.traits.insert_rows(tx, table_of(m.task), rows)
        if edges:
            tx.traits.insert_rows(tx, table_of(m.dependency), edges)
        if keys:
            tx.traits.insert_rows(tx, table_of(m.business_key), keys)
    except IntegrityError as exc:
        raise Conflict(f"a task id or business key was taken concurrently: {exc.orig}") from exc
    tx.woken.update(row["queue"] for row in rows if row["ready"])


def _insert_replay(tx: Tx, row: dict[str, Any], old: Task, depends_on: tuple[str, ...]) -> None:
    m = tx.models
    edges = [{"child_id": row["id"], "position": n, "parent_id": p} for n, p in enumerate(depends_on)]
    try:
        tx.traits.insert_rows(tx, table_of(m.task), [row])
        if edges:
            tx.traits.insert_rows(tx, table_of(m.dependency), edges)
    except IntegrityError as exc:
        raise Conflict(f"execution {old.id} was replayed concurrently: {exc.orig}") from exc
    if old.business_key is not None:
        key = m.business_key
        stmt = update(key).where(key.business_key == old.business_key).values(execution_id=row["id"])
        tx.conn.execute(stmt)
    if row["ready"]:
        tx.woken.add(row["queue"])
