"""Quota windows as rows: one per (key, epoch-aligned window), check-and-take under a row lock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import case, delete, select, update

from taskgate.brokers.base import QuotaGrant
from taskgate.brokers.sql.tx import Tx, table_of

__all__ = ["release_quota", "reserve_quota", "window_bounds"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def window_bounds(now: datetime, period: timedelta) -> tuple[datetime, datetime]:
    """The epoch-aligned window ``[start, end)`` of ``period`` holding ``now``, in whole microseconds."""
    period_us = period // _MICROSECOND
    start = _EPOCH + timedelta(microseconds=(now - _EPOCH) // _MICROSECOND // period_us * period_us)
    return start, start + period


def reserve_quota(tx: Tx, key: str, limit: int, period: timedelta, n: int) -> QuotaGrant:
    """Take up to ``n`` units of the current window; the window never grants more than ``limit``."""
    start, end = window_bounds(tx.now, period)
    used = _locked_used(tx, key, start)
    if used is None:
        if _newer_window_exists(tx, key, start):
            # The clock stepped back into a window already forgotten: its count is unknown,
            # so grant nothing rather than risk issuing more than the limit.
            return QuotaGrant(key=key, window_start=start, window_end=end, granted=0, limit=limit)
        used = _open_window(tx, key, start, end, limit)
    granted = max(0, min(n, limit - used))
    if granted:
        window = tx.models.quota_window
        stmt = (
            update(window)
            .where(window.quota_key == key, window.window_start == start)
            .values(used=window.used + granted, quota_limit=limit)
        )
        tx.conn.execute(stmt)
    return QuotaGrant(key=key, window_start=start, window_end=end, granted=granted, limit=limit)


def release_quota(tx: Tx, grant: QuotaGrant, n: int) -> None:
    """Give ``n`` units back to the grant's window, if it is still kept; never below 0."""
    window = tx.models.quota_window
    stmt = (
        update(window)
        .where(window.quota_key == grant.key, window.window_start == grant.window_start)
        .values(used=case((window.used > n, window.used - n), else_=0))
    )
    tx.conn.execute(stmt)


def _locked_used(tx: Tx, key: str, start: datetime) -> int | None:
    window = tx.models.quota_window
    stmt = select(window.used).where(window.quota_key == key, window.window_start == start)
    used = tx.conn.execute(tx.traits.lock(stmt)).scalar()
    return None if used is None else int(used)


def _newer_window_exists(tx: Tx, key: str, start: datetime) -> bool:
    window = tx.models.quota_window
    stmt = select(window.window_start).where(window.quota_key == key, window.window_start > start).limit(1)
    return tx.conn.execute(stmt).first() is not None


def _open_window(tx: Tx, key: str, start: datetime, end: datetime, limit: int) -> int:
    """Create the window row (a racing creator may win: then use its row), drop older ones."""
    window = tx.models.quota_window
    values = {"quota_key": key, "window_start": start, "window_end": end, "used": 0, "quota_limit": limit}
    tx.conn.execute(tx.traits.insert_if_missing(table_of(window), values))
    # Keep the previous window (a grant from it may still be released); older ones are dead.
    tx.conn.execute(delete(window).where(window.quota_key == key, window.window_end < start))
    used = _locked_used(tx, key, start)
    assert used is not None, "the window row was just inserted"
    return used
