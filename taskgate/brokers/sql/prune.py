"""`Broker.prune` on SQL: delete final tasks in one transaction, with their edges and keys.

Three steps, each a statement or a few (chunked id lists):

1. Lock the candidates: final tasks of the asked statuses, finished by the cutoff, matching the
   filter, with no child that is not final and no replay still stored -- oldest created
   first, read by ``ix_<prefix>tasks_status_created`` (a task finishes after it was created,
   so ``created_at <= cutoff`` bounds the range), ``FOR UPDATE SKIP LOCKED`` where rows lock
   (PostgreSQL, MySQL/MariaDB; a full ``FOR UPDATE``, not PostgreSQL's ``NO KEY UPDATE``, so
   the foreign-key checks of a child or replay inserted meanwhile wait for us instead of
   failing our delete). A task some other transaction holds is skipped, not waited for.
2. Check them again in a statement of its own: under READ COMMITTED it sees what committed
   while step 1 waited for its locks -- a child submitted under this parent, or a replay of
   it, by a transaction that share-locked the row before us and committed since. Those stay.
   A submit or replay that comes after our lock waits for it, then finds the parent gone
   (`TaskNotFoundError`). SQLite writes one transaction at a time: nothing can come between.
3. Delete: business keys (freed with their last execution; pointed back at the replayed
   execution when the newest goes), edges naming the tasks either way, their durable steps,
   then the rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, and_, bindparam, delete, exists, not_, or_, select, update
from sqlalchemy.orm import aliased

from taskgate.brokers.params import Prune
from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.rows import chunks
from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.models import Models
from taskgate.task import FINAL_STATUSES

__all__ = ["prune"]

_FINAL = sorted(s.value for s in FINAL_STATUSES)


def prune(tx: Tx, params: Prune) -> int:
    """Delete the tasks ``params`` names (at most its limit); how many went."""
    rows = tx.conn.execute(_candidates(tx.models, tx.traits, params), _bind(tx, params)).all()
    if not rows:
        return 0
    kept = _kept(tx, [row.id for row in rows])
    doomed = [row for row in rows if row.id not in kept]
    _free_keys(tx, [(row.id, row.business_key, row.replay_of) for row in doomed if row.business_key])
    _delete(tx, [row.id for row in doomed])
    return len(doomed)


def _bind(tx: Tx, params: Prune) -> dict[str, Any]:
    values: dict[str, Any] = {
        "p_statuses": [s.value for s in params.statuses],
        "p_cutoff": tx.now - params.older_than,
        "p_limit": params.limit,
    }
    if params.queues is not None:
        values["p_queues"] = list(params.queues)
    if params.exclude_queues:
        values["p_excluded"] = list(params.exclude_queues)
    if params.type is not None:
        values["p_type"] = params.type
    if params.group is not None:
        values["p_group"] = params.group
    return values


def _candidates(models: Models, traits: Traits, params: Prune) -> Select[Any]:
    return _candidate_statement(
        models,
        traits,
        params.queues is not None,
        bool(params.exclude_queues),
        params.type is not None,
        params.group is not None,
    )


@functools.lru_cache(maxsize=64)
def _candidate_statement(
    models: Models, traits: Traits, by_queue: bool, excluding: bool, by_type: bool, by_group: bool
) -> Select[Any]:
    task = table_of(models.task)
    cutoff = bindparam("p_cutoff", type_=task.c.created_at.type)
    where = [
        task.c.status.in_(bindparam("p_statuses", expanding=True)),
        task.c.created_at <= cutoff,
        task.c.finished_at <= cutoff,
        not_(_live_child(models, task.c.id)),
        not_(_replayed(models, task.c.id)),
    ]
    if by_queue:
        where.append(task.c.queue.in_(bindparam("p_queues", expanding=True)))
    if excluding:
        where.append(task.c.queue.not_in(bindparam("p_excluded", expanding=True)))
    if by_type:
        where.append(task.c.type == bindparam("p_type"))
    if by_group:
        where.append(task.c.group_name == bindparam("p_group"))
    stmt = (
        select(task.c.id, task.c.business_key, task.c.replay_of)
        .where(and_(*where))
        .order_by(task.c.created_at, task.c.id)
        .limit(bindparam("p_limit"))
    )
    return traits.lock_for_delete(stmt)


def _live_child(models: Models, parent: Any) -> Any:
    """EXISTS a child of ``parent`` that is not final."""
    edge, child = table_of(models.dependency), aliased(table_of(models.task))
    return exists(
        select(edge.c.child_id)
        .join(child, child.c.id == edge.c.child_id)
        .where(edge.c.parent_id == parent, child.c.status.not_in(_FINAL))
    )


def _replayed(models: Models, execution: Any) -> Any:
    """EXISTS an execution that replayed ``execution``."""
    newer = aliased(table_of(models.task))
    return exists(select(newer.c.id).where(newer.c.replay_of == execution))


def _kept(tx: Tx, ids: Sequence[str]) -> set[str]:
    """Which of the locked ``ids`` gained a live child or a replay while we waited for them."""
    if tx.traits.one_writer:
        return set()  # nothing committed between our read and now
    task = table_of(tx.models.task)
    kept: set[str] = set()
    for part in chunks(ids):
        stmt = select(task.c.id).where(
            task.c.id.in_(list(part)),
            or_(_live_child(tx.models, task.c.id), _replayed(tx.models, task.c.id)),
        )
        kept.update(tx.conn.execute(stmt).scalars())
    return kept


def _free_keys(tx: Tx, keyed: Sequence[tuple[str, str, str | None]]) -> None:
    """Each deleted execution's business key: deleted with it, or pointed at the execution it
    replayed (the newest left: its replay is going, and nothing else replayed it)."""
    key = table_of(tx.models.business_key)
    first = [task_id for task_id, _, replay_of in keyed if replay_of is None]
    for part in chunks(first):  # a key's row names its newest execution: this one
        tx.conn.execute(delete(key).where(key.c.execution_id.in_(list(part))))
    for task_id, business_key, replay_of in keyed:
        if replay_of is not None:  # rare: a replay chain's newest
            named = and_(key.c.business_key == business_key, key.c.execution_id == task_id)
            tx.conn.execute(update(key).where(named).values(execution_id=replay_of))


def _delete(tx: Tx, ids: Sequence[str]) -> None:
    edge, task, step = table_of(tx.models.dependency), table_of(tx.models.task), table_of(tx.models.step)
    for part in chunks(ids):
        listed = list(part)
        tx.conn.execute(delete(edge).where(or_(edge.c.child_id.in_(listed), edge.c.parent_id.in_(listed))))
        tx.conn.execute(delete(step).where(step.c.task_id.in_(listed)))
    for part in chunks(ids):
        tx.conn.execute(delete(task).where(task.c.id.in_(list(part))))
