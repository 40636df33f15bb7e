"""A queue's limits shared by every process of the database: slots, start rate, turn-taking.

A claim carrying `SharedLimits` runs in ONE transaction that first locks the queue's row of
``<prefix>queue_limits`` -- so the claims of one queue take turns at their limits, whichever
process makes them, while claims of other queues go on -- and then:

1. gives back the slots named by ``release`` and counts the queue's live slots
   (``<prefix>slots``: one row per slot, under its lease's token, until ``expires_at``; a
   crashed holder's row simply stops counting when it expires, and the next claim clears it);
2. leaves one free slot to each other claimer owed a turn (the row's ``waiters``);
3. asks the rate limiter (GCRA: the row's ``rate_tat``) how many starts it allows now;
4. claims at most that many tasks (within the quota, when one is given);
5. writes one slot row per task claimed and moves ``rate_tat`` on by the starts taken.

Units, slots and starts are spent only for tasks claimed, in the transaction that claims
them, so a claim that fails or finds nothing spends nothing. On SQLite the immediate write
transaction already serializes every writer; the row lock is what does it on PostgreSQL and
MySQL/MariaDB, where claims of one queue would otherwise count the same free slot twice.

Turn-taking (the same rule the Redis broker applies): a claimer whose handlers finish gives
their slots back in its next claim, so without a rule it would take them straight back and a
claimer in another process would never see a free slot. A claimer that found no free slot
while tasks were due is noted as owed one (once, until ``now + lease_ttl``, so one that went
away is forgotten); every other claimer leaves one free slot per noted waiter, and a waiter
one per waiter noted before it -- first come, first served, so the claimer whose handlers just
finished, which hears of the free slots first, does not jump the line. A waiter that gets a
slot is struck off.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Delete,
    Integer,
    Select,
    String,
    Update,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    null,
    select,
    true,
    update,
)

from taskgate.brokers.base import Lease
from taskgate.brokers.gcra import Gcra
from taskgate.brokers.params import Claim, Claimed, Renewal
from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.groups import GroupLimits
from taskgate.brokers.sql.leases import (
    claim_params,
    due_order,
    due_where,
    one_statement_claim_parts,
    typed_as,
)
from taskgate.brokers.sql.rows import snapshot
from taskgate.brokers.sql.tx import OneStatement, Tx, table_of
from taskgate.models import Models

__all__ = ["can_hand_over", "claim_shared", "give_back_slots", "hand_over", "hand_over_plan", "renew_slot"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_QUEUE_ROW = ""  # ``group_name`` of the row that holds the queue's own limits

# How to lease up to n tasks, when not the oldest due: the groups' pick (`GroupLimits`).
LeaseUpTo = Callable[[int], list[Lease]]
# Claims the queue's slots and starts allow: (how many tasks to claim, how to lease them; None:
# the oldest due) -> what was claimed (within the quota, when the claim has one).
Take = Callable[[int, LeaseUpTo | None], Claimed]


def claim_shared(tx: Tx, claim: Claim, take: Take) -> Claimed:
    """``claim`` under its `SharedLimits`, in the caller's transaction (see the module docstring).

    ``take(n)`` claims up to ``n`` due tasks (spending quota units, when the claim has a quota);
    the answer is its `Claimed` with ``retry_after`` > 0 when the rate held due tasks back.
    """
    shared = claim.shared
    assert shared is not None, "claim_shared needs Claim.shared"
    queue, now = claim.queue, tx.now
    row = _lock_queue_row(tx, queue)
    unused = shared.workers - _live_slots(tx, queue, shared.release)
    groups = GroupLimits(tx, claim) if shared.grouped else None
    if groups is not None:
        groups.load()
    turns = _Turns(row.waiters, shared.claimer, _micros(now))
    free = unused - turns.owed
    wanted = min(claim.limit, free)
    rate = Gcra(shared.rps, shared.burst, row.rate_tat, now) if shared.rps > 0 else None
    allowed = wanted if rate is None else min(wanted, rate.room())
    claimed = take(allowed, None if groups is None else groups.lease_up_to) if allowed > 0 else Claimed([])
    taken = len(claimed.leases)
    _hold_slots(tx, queue, claimed.leases)
    if groups is not None:
        groups.write()
    # Whether tasks are left due, asked at most once (nothing this claim does afterwards
    # changes it), and only where an answer depends on it.
    due = functools.cache(lambda: _any_due(tx, queue, claim.types))
    retry_after = 0.0
    if rate is not None:
        rate.spend(taken)
        if taken == allowed < wanted and due():
            retry_after = rate.wait()
    if turns.active:
        turns.settle(taken, lambda: free <= 0 and due(), claim.lease_ttl)
        if shared.release and turns.owed and unused - taken > 0 and due():
            tx.woken.add(queue)  # slots given back and left to waiters: let them claim now
    _write_queue_row(tx, queue, row, rate, turns)
    return replace(claimed, retry_after=retry_after) if retry_after else claimed


def can_hand_over(claim: Claim) -> bool:
    """Whether ``claim`` may hand its released slots over (`hand_over`): no rate, no quota, no
    group limits, and at least as many slots given back as tasks asked for."""
    shared = claim.shared
    return (
        shared is not None and shared.rps == 0 and claim.quota is None and len(shared.release) >= claim.limit
    )


def hand_over(tx: Tx, claim: Claim, take: Take) -> Claimed | None:
    """The slots ``claim`` gives back, handed to the tasks it claims (see the module docstring),
    in the caller's transaction; None when none could be: then nothing was written."""
    shared = claim.shared
    assert shared is not None and can_hand_over(claim), "hand_over needs a claim that can hand over"
    queue = claim.queue
    params = {"p_queue": queue, "p_group": _QUEUE_ROW, "p_tokens": list(shared.release), "p_now": tx.now}
    handed = tx.write(_statements(tx.models, tx.traits).hand_back, params)
    if handed <= 0:
        return None
    claimed = take(min(claim.limit, handed), None)
    _hold_slots(tx, queue, claimed.leases)
    return claimed


def hand_over_plan(tx: Tx, claim: Claim) -> OneStatement[Claimed | None]:
    """`hand_over` as ONE statement (data-modifying CTEs, ``traits.dml_ctes``), to run in
    autocommit: its answer is None when nothing could be handed over (nothing was written)."""
    shared = claim.shared
    assert shared is not None and can_hand_over(claim), "hand_over_plan needs a claim that can hand over"
    now = tx.now
    expires_at = now + claim.lease_ttl
    params = {
        **claim_params(claim.queue, claim.limit, now, claim.types),
        "p_group": _QUEUE_ROW,
        "p_tokens": list(shared.release),
        "p_expires_at": expires_at,
    }

    def answer(rows: Sequence[Mapping[str, Any]]) -> Claimed | None:
        if not rows or not rows[0]["handed"]:
            return None
        claimed = sorted((row for row in rows if row["id"] is not None), key=due_order)
        return Claimed(
            [Lease(task=snapshot(row), token=row["lease_token"], expires_at=expires_at) for row in claimed]
        )

    return OneStatement(_hand_over_statement(tx.models, tx.traits, typed_as(claim.types)), params, answer)


def give_back_slots(tx: Tx, queue: str, tokens: Sequence[str]) -> None:
    """Free the slots of ``queue`` held under ``tokens``; a token not held is ignored."""
    if tokens:
        tx.write(_statements(tx.models, tx.traits).release, {"p_queue": queue, "p_tokens": list(tokens)})


def renew_slot(tx: Tx, queue: str, renewal: Renewal, token: str) -> Renewal:
    """Move the slot held under ``token`` to the lease's new end; ``slot_lost`` when it was
    given back or had expired (an expired slot may be counted as free already: not renewed)."""
    params = {"p_queue": queue, "p_token": token, "p_now": tx.now, "p_expires_at": renewal.expires_at}
    renewed = tx.write(_statements(tx.models, tx.traits).renew, params)
    return renewal if renewed else replace(renewal, slot_lost=True)


# -- the queue's row ---------------------------------------------------------------------


@dataclass(slots=True)
class _QueueRow:
    rate_tat: datetime | None
    waiters: dict[str, int]


def _lock_queue_row(tx: Tx, queue: str) -> _QueueRow:
    """The queue's limits row, locked until commit (made first if the queue has none yet)."""
    statements = _statements(tx.models, tx.traits)
    params = {"p_queue": queue, "p_group": _QUEUE_ROW}
    rows = tx.fetch(statements.lock_row, params)
    if not rows:
        table = table_of(tx.models.queue_limit)
        tx.conn.execute(tx.traits.insert_if_missing(table, {"queue": queue, "group_name": _QUEUE_ROW}))
        rows = tx.fetch(statements.lock_row, params)
    (row,) = rows
    return _QueueRow(rate_tat=row["rate_tat"], waiters=_decode_waiters(row["waiters"]))


def _write_queue_row(tx: Tx, queue: str, row: _QueueRow, rate: Gcra | None, turns: _Turns) -> None:
    """Store what the claim changed: the rate's arrival time, the waiters (nothing if neither)."""
    tat = rate.tat if rate is not None and rate.changed else row.rate_tat
    waiters = turns.waiters if turns.changed else row.waiters
    if tat == row.rate_tat and not turns.changed:
        return
    params = {"p_queue": queue, "p_group": _QUEUE_ROW, "p_tat": tat, "p_waiters": _encode_waiters(waiters)}
    tx.write(_statements(tx.models, tx.traits).write_row, params)


def _decode_waiters(stored: str | None) -> dict[str, int]:
    if not stored:
        return {}
    decoded = json.loads(stored)
    return {str(k): int(v) for k, v in decoded.items()} if isinstance(decoded, dict) else {}


def _encode_waiters(waiters: dict[str, int]) -> str | None:
    return json.dumps(waiters, separators=(",", ":"), sort_keys=True) if waiters else None


# -- slots -------------------------------------------------------------------------------


def _live_slots(tx: Tx, queue: str, release: Sequence[str]) -> int:
    """Give back ``release``, then count the queue's slots still held; clears expired ones."""
    statements = _statements(tx.models, tx.traits)
    give_back_slots(tx, queue, release)
    params = {"p_queue": queue, "p_now": tx.now}
    (counts,) = tx.fetch(statements.count, params)
    expired = int(counts["expired"] or 0)
    if expired:
        tx.write(statements.clear_expired, params)
    return int(counts["held"] or 0) - expired


def _hold_slots(tx: Tx, queue: str, leases: Sequence[Lease]) -> None:
    """One slot per lease, under its token, expiring with it."""
    if leases:
        rows = [
            {
                "queue": queue,
                "token": lease.token,
                "group_name": lease.task.group,
                "expires_at": lease.expires_at,
            }
            for lease in leases
        ]
        tx.traits.insert_rows(tx, table_of(tx.models.slot), rows)


def _any_due(tx: Tx, queue: str, types: tuple[str, ...] | None) -> bool:
    """Whether a task of ``queue`` (of ``types``, None: any) is due now and not claimed (by
    this transaction or another that committed)."""
    if types is None:
        return bool(tx.fetch(_statements(tx.models, tx.traits).any_due, {"p_queue": queue, "p_now": tx.now}))
    params = claim_params(queue, 1, tx.now, types)
    del params["p_limit"]  # the statement's limit is its own
    return bool(tx.fetch(_any_due_of_types(tx.models, tx.traits, typed_as(types)), params))


@functools.lru_cache(maxsize=32)
def _any_due_of_types(models: Models, traits: Traits, typed: int) -> Select[Any]:
    """`_any_due`'s statement for a claim of some types (`Claim.types`)."""
    task = table_of(models.task)
    now = bindparam("p_now", type_=task.c.run_at.type)
    return select(task.c.id).where(*due_where(task, traits, now, typed=typed)).limit(1)


# -- the rate (GCRA) ---------------------------------------------------------------------


# -- turn-taking -------------------------------------------------------------------------


class _Turns:
    """The claimers owed a turn at a free slot, as this claim sees and leaves them."""

    def __init__(self, stored: dict[str, int], claimer: str, now_us: int) -> None:
        self.active = bool(claimer)
        self._claimer, self._now_us = claimer, now_us
        self.waiters = {c: until for c, until in stored.items() if until > now_us}
        self.changed = len(self.waiters) != len(stored)
        self._waiting = self.active and claimer in self.waiters
        # One free slot left per waiter -- per waiter noted earlier, for a waiter (same ttl:
        # noted earlier is due to expire earlier).
        if not self.active:
            self.owed = 0
        elif self._waiting:
            mine = self.waiters[claimer]
            self.owed = sum(1 for until in self.waiters.values() if until < mine)
        else:
            self.owed = len(self.waiters)

    def settle(self, taken: int, found_no_slot: Callable[[], bool], lease_ttl: timedelta) -> None:
        """Strike this claimer off once it got a slot; note it as owed one when it found none
        while tasks were due (once: a waiter keeps its place in line)."""
        if taken > 0:
            if self._waiting:
                del self.waiters[self._claimer]
                self.changed = True
        elif not self._waiting and found_no_slot():
            self.waiters[self._claimer] = self._now_us + lease_ttl // timedelta(microseconds=1)
            self.changed = True


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


# -- statements, built once per schema ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Statements:
    lock_row: Select[Any]
    write_row: Update
    count: Select[int, int]
    clear_expired: Delete
    release: Delete
    renew: Update
    any_due: Select[Any]
    hand_back: Delete


@functools.lru_cache(maxsize=32)
def _statements(models: Models, traits: Traits) -> _Statements:
    limits, slot, task = table_of(models.queue_limit), table_of(models.slot), table_of(models.task)
    at_row = (limits.c.queue == bindparam("p_queue"), limits.c.group_name == bindparam("p_group"))
    now = bindparam("p_now", type_=slot.c.expires_at.type)
    of_queue = slot.c.queue == bindparam("p_queue")
    expired = case((slot.c.expires_at <= now, 1), else_=0)
    return _Statements(
        lock_row=traits.lock(select(limits.c.rate_tat, limits.c.waiters).where(*at_row)),
        write_row=update(limits)
        .where(*at_row)
        .values(
            rate_tat=bindparam("p_tat", type_=limits.c.rate_tat.type),
            waiters=bindparam("p_waiters", type_=limits.c.waiters.type),
        ),
        count=select(func.count().label("held"), func.sum(expired, type_=Integer).label("expired")).where(
            of_queue
        ),
        clear_expired=delete(slot).where(of_queue, slot.c.expires_at <= now),
        release=delete(slot).where(of_queue, traits.listed(slot.c.token, "p_tokens")),
        renew=update(slot)
        .where(of_queue, slot.c.token == bindparam("p_token"), slot.c.expires_at > now)
        .values(expires_at=bindparam("p_expires_at", type_=slot.c.expires_at.type)),
        any_due=select(task.c.id)
        .where(task.c.queue == bindparam("p_queue"), task.c.ready == true(), task.c.run_at <= now)
        .limit(1),
        hand_back=_hand_back(models, traits),
    )


def _hand_back(models: Models, traits: Traits) -> Delete:
    """Delete the released slots still held, unless the queue's row names a waiter (whose turn
    the hand-over would take); the rows deleted are the slots handed over."""
    limits, slot = table_of(models.queue_limit), table_of(models.slot)
    now = bindparam("p_now", type_=slot.c.expires_at.type)
    waiting = exists().where(
        limits.c.queue == bindparam("p_queue"),
        limits.c.group_name == bindparam("p_group"),
        limits.c.waiters.is_not(None),
    )
    return delete(slot).where(
        slot.c.queue == bindparam("p_queue"),
        traits.listed(slot.c.token, "p_tokens"),
        slot.c.expires_at > now,
        ~waiting,
    )


@functools.lru_cache(maxsize=32)
def _hand_over_statement(models: Models, traits: Traits, typed: int) -> Select[Any]:
    """`hand_back` (RETURNING), the claim of at most as many tasks as it handed over, and a slot
    row per new lease, as data-modifying CTEs; one row at least, saying how many were handed."""
    slot = table_of(models.slot)
    handed = _hand_back(models, traits).returning(slot.c.token).cte("handed")
    handed_count = select(func.count()).select_from(handed).scalar_subquery()
    claimed, new_leases = one_statement_claim_parts(
        models, traits, func.least(bindparam("p_limit", type_=Integer), handed_count), typed=typed
    )
    held = (
        insert(slot)
        .from_select(
            ["queue", "token", "group_name", "expires_at"],
            select(
                bindparam("p_queue", type_=String),
                new_leases.c.token,
                null(),
                bindparam("p_expires_at", type_=slot.c.expires_at.type),
            ),
        )
        .cte("held")
    )
    count_row = select(handed_count.label("handed")).cte("handed_count")
    with_leases = claimed.join(new_leases, new_leases.c.task_id == claimed.c.id)
    columns: list[Any] = [count_row.c.handed, claimed, new_leases.c.token.label("lease_token")]
    no_flush_wait = traits.commit_without_flush_wait()
    if no_flush_wait is not None:
        columns.append(no_flush_wait.label("no_flush_wait"))
    return select(*columns).select_from(count_row.outerjoin(with_leases, true())).add_cte(held)
