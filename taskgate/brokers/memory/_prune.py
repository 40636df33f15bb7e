"""The memory broker's prune: which final records may go, and taking them out of the table.

A record goes when it is final in one of the asked statuses, finished at or before the cutoff,
matches the filter, has no child that is not final and was not replayed by a record still
stored (`Broker.prune`); its durable steps live on it and go with it. Records are looked at in
the order they were stored (creation order), so the oldest go first; the caller holds the
broker's lock for the whole call.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from taskgate.brokers.memory._record import Record
from taskgate.brokers.memory._table import TaskTable
from taskgate.brokers.params import Prune

__all__ = ["prune_records"]


def prune_records(table: TaskTable, prune: Prune, now: datetime) -> int:
    """Delete the records ``prune`` names (at most its limit) from ``table``; how many went."""
    cutoff = now - prune.older_than
    doomed: list[Record] = []
    for record in _matching(table, prune, cutoff):
        if _may_go(table, record):
            doomed.append(record)
            if len(doomed) == prune.limit:
                break
    for record in doomed:
        table.remove(record)
    return len(doomed)


def _matching(table: TaskTable, prune: Prune, cutoff: datetime) -> Iterator[Record]:
    statuses, queues, excluded = prune.statuses, prune.queues, prune.exclude_queues
    return (
        r
        for r in table.records.values()
        if r.status in statuses
        and r.finished_at is not None
        and r.finished_at <= cutoff
        and (queues is None or r.queue in queues)
        and r.queue not in excluded
        and (prune.type is None or r.type == prune.type)
        and (prune.group is None or r.group == prune.group)
    )


def _may_go(table: TaskTable, record: Record) -> bool:
    """No child of ``record`` is still to run, and no stored execution replayed it."""
    if record.id in table.replayed_by:
        return False
    records = table.records
    return all(records[child].status.is_final for child in table.children.get(record.id, ()))
