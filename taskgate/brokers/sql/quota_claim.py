"""A claim within a quota (`Claim.quota`) in fewer statements than reserve + claim + release.

PostgreSQL (data-modifying CTEs): ONE statement, below. Elsewhere: `claim_then_count`. Where
neither applies (the window is short, or has no row yet): `claim_within_grant`.


The statement locks the window row of the quota key, claims at most the units left (``SKIP
LOCKED`` on the tasks, as `leases.claim_in_one_statement`), inserts the leases and adds the
number claimed to the window -- atomic like any single statement, one round trip instead of
BEGIN, six statements and COMMIT. A concurrent claimer waits on the window row and then reads
its newest ``used`` (the row lock re-reads it), so the window never over-issues.

Only an existing window row can be locked: the first claim of a window (or a clock that
stepped back) answers "no window row" and the caller takes the transaction path, which
opens the window.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Integer, Select, Update, bindparam, func, select, true, update

from taskgate.brokers.base import Lease, QuotaGrant, QuotaSpec
from taskgate.brokers.params import Claimed
from taskgate.brokers.sql import holds, leases
from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.leases import claim_params, due_order, one_statement_claim_parts, typed_as
from taskgate.brokers.sql.quotas import window_bounds
from taskgate.brokers.sql.rows import snapshot
from taskgate.brokers.sql.tx import OneStatement, Tx, table_of
from taskgate.models import Models

__all__ = [
    "ShortWindow",
    "claim_then_count",
    "claim_within_grant",
    "claim_within_quota_in_one_statement",
    "claim_within_quota_plan",
]


class ShortWindow(Exception):
    """`claim_then_count` claimed more than the window had left, or the window has no row:
    roll the transaction back and take the careful path (reserve, claim, give back)."""


def claim_within_quota_in_one_statement(
    tx: Tx,
    queue: str,
    limit: int,
    lease_ttl: timedelta,
    quota: QuotaSpec,
    types: tuple[str, ...] | None = None,
) -> Claimed | None:
    """The claim (of ``types``; None: any) in one autocommit statement; None when the window
    has no row yet."""
    return tx.one(claim_within_quota_plan(tx, queue, limit, lease_ttl, quota, types))


def claim_within_quota_plan(
    tx: Tx,
    queue: str,
    limit: int,
    lease_ttl: timedelta,
    quota: QuotaSpec,
    types: tuple[str, ...] | None = None,
) -> OneStatement[Claimed | None]:
    """`claim_within_quota_in_one_statement`'s statement and the meaning of its rows."""
    now = tx.now
    key, quota_limit = quota.key, quota.limit
    start, end = window_bounds(now, quota.period)
    expires_at = now + lease_ttl
    params = {
        **claim_params(queue, limit, now, types),
        "p_expires_at": expires_at,
        "p_key": key,
        "p_start": start,
        "p_quota_limit": quota_limit,
    }

    def answer(rows: Sequence[Mapping[str, Any]]) -> Claimed | None:
        if not rows:
            return None
        left = max(0, quota_limit - int(rows[0]["quota_used"]))
        claimed = sorted((row for row in rows if row["id"] is not None), key=due_order)
        leases = [
            Lease(task=snapshot(row), token=row["lease_token"], expires_at=expires_at) for row in claimed
        ]
        grant = QuotaGrant(
            key=key, window_start=start, window_end=end, granted=len(leases), limit=quota_limit
        )
        held = None if leases else rows[0]["held_until"]
        return Claimed(leases=leases, quota=grant, exhausted=left == 0, held_until=held)

    return OneStatement(_statement(tx.models, tx.traits, typed_as(types)), params, answer)


@functools.lru_cache(maxsize=32)
def _statement(models: Models, traits: Traits, typed: int) -> Select[Any]:
    window = table_of(models.quota_window)
    quota_limit = bindparam("p_quota_limit", type_=Integer)
    at_window = (window.c.quota_key == bindparam("p_key"), window.c.window_start == bindparam("p_start"))
    locked_window = select(window.c.used).where(*at_window).with_for_update().cte("quota_row")
    used = func.coalesce(select(locked_window.c.used).scalar_subquery(), quota_limit)
    units_left = func.greatest(0, quota_limit - used)
    claimed, new_leases = one_statement_claim_parts(
        models, traits, func.least(bindparam("p_limit", type_=Integer), units_left), typed=typed
    )
    spent = (
        update(window)
        .where(*at_window)
        .values(used=window.c.used + select(func.count()).select_from(claimed).scalar_subquery())
        .cte("spent")
    )
    with_leases = claimed.join(new_leases, new_leases.c.task_id == claimed.c.id)
    now = bindparam("p_now", type_=table_of(models.task).c.run_at.type)
    held_until = holds.held_until_column(models, now).label("held_until")
    return (
        select(
            locked_window.c.used.label("quota_used"),
            held_until,
            claimed,
            new_leases.c.token.label("lease_token"),
        )
        .select_from(locked_window.outerjoin(with_leases, true()))
        .add_cte(spent)
    )


@functools.lru_cache(maxsize=32)
def _window_statements(models: Models) -> tuple[Update, Select[Any]]:
    """The conditional add to a window row and the read of its ``used``; built once per schema."""
    window = table_of(models.quota_window)
    at_window = (
        window.c.quota_key == bindparam("p_key"),
        window.c.window_start == bindparam("p_start", type_=window.c.window_start.type),
    )
    count = bindparam("p_count", type_=Integer)
    quota_limit = bindparam("p_quota_limit", type_=Integer)
    add_if_it_fits = (
        update(window)
        .where(*at_window, window.c.used + count <= quota_limit)
        .values(used=window.c.used + count, quota_limit=quota_limit)
    )
    return add_if_it_fits, select(window.c.used).where(*at_window)


def claim_then_count(
    tx: Tx,
    queue: str,
    limit: int,
    lease_ttl: timedelta,
    quota: QuotaSpec,
    types: tuple[str, ...] | None = None,
) -> Claimed:
    """Claim first, then add the claimed count to the window -- only where it still fits.

    The conditional ``UPDATE`` checks and adds under the window row's lock in one statement, so
    the window never over-issues; when it does not fit (or the window has no row yet) this
    raises `ShortWindow` and the caller rolls back. Two statements fewer than reserve + claim
    + give back while units are plenty, which is the common case.
    """
    key, quota_limit = quota.key, quota.limit
    start, end = window_bounds(tx.now, quota.period)
    claimed = leases.claim(tx, queue, limit, lease_ttl, types=types)
    add_if_it_fits, read_used = _window_statements(tx.models)
    at_window = {"p_key": key, "p_start": start}
    if claimed:
        params = {**at_window, "p_count": len(claimed), "p_quota_limit": quota_limit}
        if tx.write(add_if_it_fits, params) != 1:
            raise ShortWindow
        exhausted = False
    else:
        rows = tx.fetch(read_used, at_window)
        if not rows:
            raise ShortWindow  # no row: whether the window is forgotten is the careful path's call
        exhausted = int(rows[0]["used"]) >= quota_limit
    grant = QuotaGrant(key=key, window_start=start, window_end=end, granted=len(claimed), limit=quota_limit)
    return Claimed(leases=claimed, quota=grant, exhausted=exhausted)


def claim_within_grant(
    grant: QuotaGrant, claim: Callable[[int], list[Lease]], release: Callable[[QuotaGrant, int], None]
) -> Claimed:
    """Claim up to ``grant.granted`` tasks and give back the units no task took, in the
    transaction that reserved them: the caller sees units spent only for tasks claimed."""
    if grant.granted <= 0:
        return Claimed(leases=[], quota=grant, exhausted=True)
    leases = claim(grant.granted)
    if len(leases) < grant.granted:
        release(grant, grant.granted - len(leases))
    return Claimed(leases=leases, quota=dataclasses.replace(grant, granted=len(leases)))
