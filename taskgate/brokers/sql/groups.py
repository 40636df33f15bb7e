"""The limits of each group of a queue, applied by a claim under shared limits.

A group (`NewTask.group`: a tenant, a user) is limited on its own by the claim's
`SharedLimits`: ``group_workers`` slots, a start rate of ``group_rps`` with bursts of
``group_burst``, and ``group_quota_limit`` starts per epoch-aligned ``group_quota_period``.
`taskgate.brokers.sql.slots.claim_shared` applies them inside its transaction, after locking
the queue's limits row -- which every claim of the queue takes first, so the groups' rows and
slots change under that one lock and need none of their own:

1. `GroupLimits.load` reads what the groups hold: their live slots (one grouped count over the
   queue's slot rows) and their rows of ``<prefix>queue_limits`` (``group_name`` = the group:
   the rate's arrival time and the quota window's count), and works out each group's room;
2. `GroupLimits.lease_up_to` leases due tasks in claim order, passing over those of a group without
   room -- a group at its limit never holds up another -- by locking due rows in order
   (``SKIP LOCKED``), keeping those whose group has room and looking again past the last row
   seen, leaving out the groups that filled up meanwhile;
3. `GroupLimits.write` moves the rate and counts the quota of each group that started tasks.

Tasks without a group count against the queue's limits only. Only groups with something to
remember have a row or slots; a group read from nowhere has all its room.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, Select, Update, and_, bindparam, func, or_, select, update

from taskgate.brokers.base import Lease
from taskgate.brokers.gcra import Gcra
from taskgate.brokers.params import Claim
from taskgate.brokers.sql import holds
from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.leases import (
    claim_order,
    claim_params,
    due_where,
    lease_running,
    locked_due_columns,
    mark_locked_running,
    typed_as,
)
from taskgate.brokers.sql.quotas import window_bounds
from taskgate.brokers.sql.tx import Tx, table_of
from taskgate.models import Models

__all__ = ["GroupLimits"]


class GroupLimits:
    """The groups' room for one claim, and what the claim spent of it."""

    def __init__(self, tx: Tx, claim: Claim) -> None:
        shared = claim.shared
        assert shared is not None, "GroupLimits needs Claim.shared"
        self._tx, self._queue, self._shared, self._ttl = tx, claim.queue, shared, claim.lease_ttl
        self._types = claim.types
        self._window = (
            window_bounds(tx.now, shared.group_quota_period)[0] if shared.group_quota_period else None
        )
        self._room: dict[str, float] = {}  # math.inf: no limit binds the group
        self._rows: dict[str, Mapping[str, Any]] = {}
        self.taken: Counter[str] = Counter()

    def load(self) -> None:
        """Read each group's slots and row, and work out its room (after the claim gave back
        its slots and cleared the expired ones)."""
        tx, shared, statements = self._tx, self._shared, _statements(self._tx.models, self._tx.traits, 0)
        params = {"p_queue": self._queue}
        held: dict[str, int] = {}
        if shared.group_workers:
            held = {
                row["group_name"]: int(row["held"]) for row in tx.fetch(statements.slots_by_group, params)
            }
        if shared.group_rps or shared.group_quota_limit:
            # Only rows that still limit their group: a rate ahead of now, a quota window that is
            # the current one -- a busy queue's older tenants need not be read by every claim.
            binding = {**params, "p_now": tx.now, "p_window": self._window}
            self._rows = {row["group_name"]: row for row in tx.fetch(statements.group_rows, binding)}
        for group in {*held, *self._rows}:
            self._room[group] = self._room_of(group, held.get(group, 0))

    def _room_of(self, group: str, held: int) -> float:
        shared, row = self._shared, self._rows.get(group)
        room = self._fresh_room()
        if shared.group_workers:
            room = min(room, shared.group_workers - held)
        if shared.group_rps and row is not None:
            room = min(room, self._rate(row).room())
        if shared.group_quota_limit and row is not None and row["quota_window"] == self._window:
            room = min(room, shared.group_quota_limit - int(row["quota_used"] or 0))
        return room

    def _fresh_room(self) -> float:
        """The room of a group nothing is known of: every slot, a full burst, the whole quota."""
        shared = self._shared
        return min(
            shared.group_workers or math.inf,
            max(shared.group_burst, 1) if shared.group_rps else math.inf,
            shared.group_quota_limit or math.inf,
        )

    def lease_up_to(self, limit: int) -> list[Lease]:
        """Lease up to ``limit`` due tasks, in claim order, whose group has room (see the module
        docstring), counting what each group took."""
        tx, statements = self._tx, _statements(self._tx.models, self._tx.traits, typed_as(self._types))
        picked: list[Mapping[str, Any]] = []
        after: Mapping[str, Any] | None = None  # the last row looked at: a next look starts past it
        while len(picked) < limit:
            wanted = limit - len(picked)
            full = [group for group, room in self._room.items() if room <= 0]
            params: dict[str, Any] = {
                **claim_params(self._queue, wanted, tx.now, self._types),
                "p_full": full,
            }
            if after is None:
                rows = tx.fetch(statements.due_with_room, params)
            else:
                params.update(
                    p_after_priority=after["priority"], p_after_run_at=after["run_at"], p_after_id=after["id"]
                )
                rows = tx.fetch(statements.due_with_room_after, params)
            for row in rows:
                after = row
                group = row["group_name"]
                if group is None:
                    picked.append(row)
                    continue
                room = self._room.get(group, None)
                if room is None:
                    room = self._fresh_room()
                if room > 0:
                    picked.append(row)
                    self._room[group] = room - 1
                    self.taken[group] += 1
                else:
                    self._room[group] = room
                if len(picked) == limit:
                    break
            if len(rows) < wanted:
                break  # nothing more is due
        return lease_running(tx, mark_locked_running(tx, picked), self._ttl)

    def write(self) -> None:
        """Move the rate and count the quota of each group that started tasks."""
        shared, tx = self._shared, self._tx
        if not (shared.group_rps or shared.group_quota_limit):
            return
        statements = _statements(tx.models, tx.traits, 0)
        limits = table_of(tx.models.queue_limit)
        for group, n in sorted(self.taken.items()):
            row = self._rows.get(group)
            if row is None:
                tx.conn.execute(
                    tx.traits.insert_if_missing(limits, {"queue": self._queue, "group_name": group})
                )
            values: dict[str, Any] = {"p_queue": self._queue, "p_group": group}
            values["p_tat"] = self._new_tat(row, n) if shared.group_rps else (row or {}).get("rate_tat")
            if shared.group_quota_limit:
                same = row is not None and row["quota_window"] == self._window
                values["p_window"] = self._window
                values["p_used"] = (int(row["quota_used"] or 0) if same and row is not None else 0) + n
            else:
                values["p_window"] = (row or {}).get("quota_window")
                values["p_used"] = (row or {}).get("quota_used")
            tx.write(statements.write_group, values)

    def _rate(self, row: Mapping[str, Any] | None) -> Gcra:
        """The group's start rate as its row leaves it (None: no row yet)."""
        shared = self._shared
        return Gcra(
            shared.group_rps, shared.group_burst, None if row is None else row["rate_tat"], self._tx.now
        )

    def _new_tat(self, row: Mapping[str, Any] | None, starts: int) -> datetime:
        rate = self._rate(row)
        rate.spend(starts)
        return rate.tat


# -- statements, built once per schema ---------------------------------------------------


class _Statements:
    __slots__ = ("due_with_room", "due_with_room_after", "group_rows", "slots_by_group", "write_group")

    def __init__(self, models: Models, traits: Traits, typed: int) -> None:
        limits, slot, task = table_of(models.queue_limit), table_of(models.slot), table_of(models.task)
        of_queue = limits.c.queue == bindparam("p_queue")
        self.slots_by_group: Select[Any] = (
            select(slot.c.group_name, func.count().label("held"))
            .where(slot.c.queue == bindparam("p_queue"), slot.c.group_name.is_not(None))
            .group_by(slot.c.group_name)
        )
        limiting = or_(
            limits.c.rate_tat > bindparam("p_now", type_=limits.c.rate_tat.type),
            limits.c.quota_window == bindparam("p_window", type_=limits.c.quota_window.type),
        )
        self.group_rows: Select[Any] = select(
            limits.c.group_name, limits.c.rate_tat, limits.c.quota_window, limits.c.quota_used
        ).where(of_queue, limits.c.group_name != "", limiting)
        now = bindparam("p_now", type_=task.c.run_at.type)
        due = (
            select(*locked_due_columns(models))
            .where(
                *due_where(task, traits, now, typed=typed),
                holds.not_held(models, now),
                # An expanding NOT IN: SQLAlchemy renders an empty list as matching everything.
                or_(
                    task.c.group_name.is_(None), task.c.group_name.not_in(bindparam("p_full", expanding=True))
                ),
            )
            .order_by(*claim_order(task))
            .limit(bindparam("p_limit", type_=Integer))
        )
        # Past the last row seen in `claim_order`: a lower priority, or the same one and later.
        after_priority = bindparam("p_after_priority", type_=Integer)
        after_run_at = bindparam("p_after_run_at", type_=task.c.run_at.type)
        after_id = bindparam("p_after_id", type_=task.c.id.type)
        later = or_(task.c.run_at > after_run_at, and_(task.c.run_at == after_run_at, task.c.id > after_id))
        past = or_(task.c.priority < after_priority, and_(task.c.priority == after_priority, later))
        self.due_with_room = traits.lock(due, skip_locked=True)
        self.due_with_room_after = traits.lock(due.where(past), skip_locked=True)
        self.write_group: Update = (
            update(limits)
            .where(of_queue, limits.c.group_name == bindparam("p_group"))
            .values(
                rate_tat=bindparam("p_tat", type_=limits.c.rate_tat.type),
                quota_window=bindparam("p_window", type_=limits.c.quota_window.type),
                quota_used=bindparam("p_used", type_=Integer),
            )
        )


@functools.lru_cache(maxsize=32)
def _statements(models: Models, traits: Traits, typed: int) -> _Statements:
    """The statements for claims of ``typed`` (`taskgate.brokers.sql.leases.typed_as`)."""
    return _Statements(models, traits, typed)
