"""`Gate.purge`: final tasks deleted on demand, in bounded `Broker.prune` calls.

A purge is a `Prune` built from a `Filter` and an age, run until a call deletes nothing: each
call is one bounded unit of the broker, so a purge of many tasks never holds a lock or a
script for long, and what it deleted stays deleted if a later call fails. Only final tasks go:
a filter naming a status that is not final is refused before anything is deleted.
"""

from __future__ import annotations

from datetime import timedelta

from taskgate.brokers.base import MAX_DELAY, Broker
from taskgate.brokers.params import Prune
from taskgate.durations import DurationLike, parse_duration
from taskgate.runtime.calls import BrokerCalls
from taskgate.task import FINAL_STATUSES, Filter, Status

__all__ = ["PURGE_BATCH", "purge", "purge_params"]

PURGE_BATCH = 500
_FINAL = tuple(sorted(FINAL_STATUSES))


def purge_params(filter: Filter | None, older_than: DurationLike | None) -> tuple[Prune, int]:
    """The prune a purge of ``filter`` and ``older_than`` makes, and the most tasks it deletes
    (``filter.limit``; 0: all); `TypeError`/`ValueError` naming what cannot be purged."""
    flt = filter if filter is not None else Filter()
    if not isinstance(flt, Filter):
        raise TypeError(f"filter must be a taskgate.Filter or None, got {type(flt).__name__}")
    if flt.status is not None and not flt.status.is_final:
        raise ValueError(
            "purge deletes final tasks only (completed, failed, canceled); "
            f"the filter names status {flt.status.value}"
        )
    if flt.business_key is not None or flt.parent is not None or flt.offset:
        raise ValueError(
            "purge filters by status, type, queue and group (and limit); not business_key, parent or offset"
        )
    age = _age(older_than)
    statuses: tuple[Status, ...] = _FINAL if flt.status is None else (flt.status,)
    queues = None if flt.queue is None else (flt.queue,)
    prune = Prune(statuses, older_than=age, queues=queues, type=flt.type, group=flt.group, limit=PURGE_BATCH)
    return prune, flt.limit


def _age(older_than: DurationLike | None) -> timedelta:
    if older_than is None:
        return timedelta(0)
    age = parse_duration(older_than, field="older_than")
    if not timedelta(0) <= age <= MAX_DELAY:
        raise ValueError(f"older_than must be a duration from 0 to {MAX_DELAY.days} days, got {older_than!r}")
    return age


async def purge(calls: BrokerCalls, broker: Broker, prune: Prune, limit: int) -> int:
    """Run ``prune`` until a call deletes nothing (or ``limit`` tasks went; 0: no limit); how
    many went. A short call is not the end: it may have left an execution newest that it could
    not delete while its replay was stored."""
    deleted = 0
    while True:
        batch = prune if not limit else _capped(prune, limit - deleted)
        went: int = await calls(broker.prune, batch)
        deleted += went
        if not went or (limit and deleted >= limit):
            return deleted


def _capped(prune: Prune, left: int) -> Prune:
    if left >= prune.limit:
        return prune
    return Prune(
        prune.statuses,
        older_than=prune.older_than,
        queues=prune.queues,
        type=prune.type,
        group=prune.group,
        limit=left,
        exclude_queues=prune.exclude_queues,
    )
