"""A queue's hold: the ``held_until`` of its own row in ``<prefix>queue_limits``.

The queue's row is the one with ``group_name = ''`` (`taskgate.brokers.sql.slots` makes and
locks the same row for shared limits). A queue is held while ``now < held_until``; a pause
until resumed stores `HELD_INDEFINITELY` (9999-12-31, which every dialect's column holds).

Claims honour a hold without a statement of their own: each claim statement carries
`not_held` (``NOT EXISTS`` on the row's primary key), so it leases nothing from a held queue,
and only a claim that came back empty reads the hold to answer it (`answer_if_held`) -- the
plain claim costs an index probe more, never a round trip. A hold is written under the row's
lock, and never shortened but by a resume.
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Select,
    Update,
    bindparam,
    exists,
    literal_column,
    or_,
    select,
    update,
)

from taskgate.brokers.params import HELD_INDEFINITELY, Claimed, Hold
from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.models import Models

__all__ = ["answer_if_held", "extend", "held_until", "held_until_column", "hold", "not_held"]


def not_held(models: Models, now: BindParameter[Any]) -> ColumnElement[bool]:
    """A claim statement's clause: the queue ``p_queue`` has no hold at ``now``."""
    return ~exists(_hold_at(models, now))


def held_until_column(models: Models, now: BindParameter[Any]) -> ColumnElement[Any]:
    """The hold of ``p_queue`` at ``now`` (NULL: not held), as a column of a one-statement claim."""
    return _hold_at(models, now).scalar_subquery()


def held_until(tx: Tx, queue: str) -> datetime | None:
    """``queue``'s hold now; None when it is not held."""
    rows = tx.fetch(_statements(tx.models).read, {"p_queue": queue, "p_now": tx.now})
    return rows[0]["held_until"] if rows else None


def answer_if_held(tx: Tx, queue: str, claimed: Claimed) -> Claimed:
    """``claimed``, answered as held when it leased nothing because ``queue`` is held (nothing
    held back by a rate then: the hold is why)."""
    if claimed.leases or claimed.held_until is not None:
        return claimed
    until = held_until(tx, queue)
    return claimed if until is None else dataclasses.replace(claimed, held_until=until, retry_after=0.0)


def extend(tx: Tx, queue: str, until: datetime) -> None:
    """Hold ``queue`` until ``until``, keeping a longer hold (makes the queue's row if need be).

    The row is locked first, whether or not the hold changes: an UPDATE that keeps a longer
    hold matches no row and so would lock none, and a resume committed before this
    transaction's next read of the hold would make it read none (the hold it answers must be
    the one it left).
    """
    table = table_of(tx.models.queue_limit)
    tx.conn.execute(tx.traits.insert_if_missing(table, {"queue": queue, "group_name": ""}))
    row = (table.c.queue == queue, table.c.group_name == literal_column("''"))
    tx.conn.execute(tx.traits.lock(select(table.c.held_until).where(*row)))
    tx.write(_statements(tx.models).extend, {"p_queue": queue, "p_until": until})


def hold(tx: Tx, request: Hold) -> datetime | None:
    """Carry out ``request`` (`taskgate.brokers.base.Broker.hold`); the queue's hold after it."""
    queue = request.queue
    if request.resume:
        tx.write(_statements(tx.models).resume, {"p_queue": queue})
        tx.woken.add(queue)  # its due tasks may be claimed now
        return None
    extend(tx, queue, HELD_INDEFINITELY if request.for_ is None else tx.now + request.for_)
    return held_until(tx, queue)


def _hold_at(models: Models, now: BindParameter[Any]) -> Select[Any]:
    limits = table_of(models.queue_limit)
    return select(limits.c.held_until).where(
        limits.c.queue == bindparam("p_queue"),
        limits.c.group_name == literal_column("''"),
        limits.c.held_until > now,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Statements:
    read: Select[Any]
    extend: Update
    resume: Update


@functools.lru_cache(maxsize=32)
def _statements(models: Models) -> _Statements:
    limits = table_of(models.queue_limit)
    at_row = (limits.c.queue == bindparam("p_queue"), limits.c.group_name == literal_column("''"))
    until = bindparam("p_until", type_=limits.c.held_until.type)
    return _Statements(
        read=_hold_at(models, bindparam("p_now", type_=limits.c.held_until.type)),
        extend=update(limits)
        .where(*at_row, or_(limits.c.held_until.is_(None), limits.c.held_until < until))
        .values(held_until=until),
        resume=update(limits).where(*at_row).values(held_until=None),
    )
