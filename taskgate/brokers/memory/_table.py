"""The memory broker's storage: task records plus every index a transition needs.

All methods assume the caller holds the broker's lock. `set_status` is the only way a
record's status changes (and `start_due`, its claim-path form for a batch), so the counters,
the ready heaps and the running set can never disagree with the records.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime

from taskgate.brokers.memory._record import Record
from taskgate.errors import TaskNotFoundError
from taskgate.task import Filter, Status, Task

__all__ = ["READY_STATUSES", "TaskTable"]

READY_STATUSES = frozenset({Status.PENDING, Status.RETRYING})

# (run_at, id, ready_seq): heap order is the claim order within one priority; the seq detects
# stale entries.
_ReadyEntry = tuple[datetime, str, int]
# One ready heap per (queue, type, priority): a claim for some types finds its tasks without
# passing the due tasks of the others, and takes a priority's due tasks before a lower one's
# (a not-yet-due task of a higher priority waits in its heap without holding up the others).
_HeapKey = tuple[str, str, int]


class TaskTable:
    """Records and indexes of one memory broker. Not thread-safe on its own."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        self.children: defaultdict[str, list[str]] = defaultdict(list)
        self.by_key: dict[str, list[str]] = {}
        self.replayed_by: dict[str, str] = {}
        self.running: dict[str, None] = {}
        self._ready: defaultdict[_HeapKey, list[_ReadyEntry]] = defaultdict(list)
        self._types: defaultdict[str, dict[str, None]] = defaultdict(dict)  # a queue's types, ever
        # A queue's priorities, ever, highest first: the order its claims walk them in.
        self._priorities: defaultdict[str, list[int]] = defaultdict(list)
        self._counts: defaultdict[str, defaultdict[Status, int]] = defaultdict(lambda: defaultdict(int))
        self._queue_len: defaultdict[str, int] = defaultdict(int)
        self._blocked: defaultdict[str, int] = defaultdict(int)  # blocked tasks by queue

    # -- records ---------------------------------------------------------------------------

    def find(self, task_id: str) -> Record:
        """The record of ``task_id``; raises `TaskNotFoundError`."""
        record = self.records.get(task_id)
        if record is None:
            raise TaskNotFoundError(f"no task with id {task_id!r}")
        return record

    def add(self, record: Record) -> None:
        """Store a new record and index it under its parents and business key."""
        self.records[record.id] = record
        for parent in dict.fromkeys(record.depends_on):  # a parent named twice wakes once
            self.children[parent].append(record.id)
        if record.business_key is not None:
            self.by_key.setdefault(record.business_key, []).append(record.id)
        self._count(record, +1)
        self._enter(record)

    def remove(self, record: Record) -> None:
        """Delete a final ``record`` and every index entry naming it (`Broker.prune`).

        Its business key goes with its last execution; a replay chain's newest going leaves the
        one it replayed newest again. Its ready-heap entries, if any are left, go stale.
        """
        del self.records[record.id]
        self._count(record, -1)
        for parent in dict.fromkeys(record.depends_on):
            siblings = self.children.get(parent)
            if siblings is not None:
                siblings.remove(record.id)
                if not siblings:
                    del self.children[parent]
        self.children.pop(record.id, None)  # final children keep naming it in depends_on
        if record.business_key is not None:
            executions = self.by_key[record.business_key]
            executions.remove(record.id)
            if not executions:
                del self.by_key[record.business_key]
        if record.replay_of is not None and self.replayed_by.get(record.replay_of) == record.id:
            del self.replayed_by[record.replay_of]

    def set_status(self, record: Record, status: Status) -> None:
        """Move ``record`` to ``status``, keeping counters, ready heaps and running set in step.

        The counters written out (every ack runs this per task), the entry through `_enter`, as
        for a new record. A ready-heap entry is not removed on leaving: its seq goes stale and
        claim drops it.
        """
        old = record.status
        by_status = self._counts[record.type]
        by_status[old] -= 1
        by_status[status] += 1
        was_ready, is_ready = old in READY_STATUSES, status in READY_STATUSES
        if was_ready is not is_ready:
            self._queue_len[record.queue] += 1 if is_ready else -1
        if old is Status.BLOCKED:
            self._blocked[record.queue] -= 1
        elif status is Status.BLOCKED:
            self._blocked[record.queue] += 1
        if old is Status.RUNNING:
            del self.running[record.id]
            record.token = None
            record.lease_expires_at = None
        record.status = status
        self._enter(record)

    def _count(self, record: Record, delta: int) -> None:
        self._counts[record.type][record.status] += delta
        if record.status in READY_STATUSES:
            self._queue_len[record.queue] += delta
        elif record.status is Status.BLOCKED:
            self._blocked[record.queue] += delta

    def _enter(self, record: Record) -> None:
        if record.status is Status.RUNNING:
            self.running[record.id] = None
        elif record.status in READY_STATUSES:
            record.ready_seq += 1
            key = (record.queue, record.type, record.priority)
            if key not in self._ready:
                self._new_heap(key)
            heapq.heappush(self._ready[key], (record.run_at, record.id, record.ready_seq))

    def _new_heap(self, key: _HeapKey) -> None:
        queue, task_type, priority = key
        self._types[queue][task_type] = None
        priorities = self._priorities[queue]
        if priority not in priorities:
            priorities.append(priority)
            priorities.sort(reverse=True)

    # -- ready heaps -----------------------------------------------------------------------

    def start_due(
        self, queue: str, now: datetime, limit: int, types: tuple[str, ...] | None = None
    ) -> list[Record]:
        """Up to ``limit`` due ready records of ``queue`` (of ``types``; None: any), in claim
        order (highest priority, then oldest due), moved to running.

        `set_status` to running written out for a batch (a claim's hot path): no call per record.
        """
        due: list[Record] = []
        for heaps in self._levels(queue, types):
            if len(heaps) == 1:
                due += self._due_of(heaps[0], now, limit - len(due))
            else:
                due += self._due_merged(heaps, now, limit - len(due))
            if len(due) == limit:
                break
        self.start(queue, due)
        return due

    def start(self, queue: str, records: list[Record]) -> None:
        """Move ready ``records`` of ``queue`` to running (their heap entries go stale)."""
        for record in records:
            by_status = self._counts[record.type]
            by_status[record.status] -= 1
            by_status[Status.RUNNING] += 1
            record.status = Status.RUNNING
            self.running[record.id] = None
        self._queue_len[queue] -= len(records)

    def due_in_order(self, queue: str, now: datetime, types: tuple[str, ...] | None) -> Iterator[Record]:
        """The due ready records of ``queue`` (of ``types``; None: any), in claim order, without
        taking any: a walk that may pass over records (a claim under group limits).

        The heaps are read, not popped: a frontier of heap positions, highest priority and
        smallest entry first, whose children join it as it is taken -- k records cost
        O(k log k), whatever lies behind them. Do not change the table while the walk is under way.
        """
        heaps = [(-priority, heap) for priority, level in self._ranked(queue, types) for heap in level]
        frontier = [(rank, heap[0], n, 0) for n, (rank, heap) in enumerate(heaps) if heap]
        heapq.heapify(frontier)
        while frontier:
            rank, entry, n, position = heapq.heappop(frontier)
            if entry[0] > now:
                continue  # nothing below it in its heap is due either
            record = self._live(*entry)
            if record is not None:
                yield record
            heap = heaps[n][1]
            for child in (2 * position + 1, 2 * position + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (rank, heap[child], n, child))

    def _heaps(self, queue: str, types: tuple[str, ...] | None) -> list[list[_ReadyEntry]]:
        """The ready heaps of ``queue``'s ``types`` (None: all its types) that exist, of every priority."""
        return [heap for _, level in self._ranked(queue, types) for heap in level]

    def _levels(self, queue: str, types: tuple[str, ...] | None) -> Iterator[list[list[_ReadyEntry]]]:
        """The ready heaps of ``queue``'s ``types`` (None: all its types), one list per
        priority, highest first."""
        return (level for _, level in self._ranked(queue, types))

    def _ranked(
        self, queue: str, types: tuple[str, ...] | None
    ) -> Iterator[tuple[int, list[list[_ReadyEntry]]]]:
        """Each priority of ``queue`` with its ready heaps of ``types`` (None: all its types),
        highest first. A heap found empty is dropped, and its priority with its last heap: a
        claim walks the priorities that hold tasks, not every one the queue ever had."""
        ready = self._ready
        names = self._types.get(queue, ()) if types is None else types
        for priority in tuple(self._priorities.get(queue, ())):
            level = []
            for name in names:
                key = (queue, name, priority)
                heap = ready.get(key)
                if heap:
                    level.append(heap)
                elif heap is not None:
                    del ready[key]  # drained: the next task of it makes it again (`_enter`)
            if level:
                yield priority, level
            elif not any((queue, name, priority) in ready for name in self._types[queue]):
                self._priorities[queue].remove(priority)

    def _due_of(self, heap: list[_ReadyEntry], now: datetime, limit: int) -> list[Record]:
        """Up to ``limit`` live due records taken off one heap, in its order."""
        due: list[Record] = []
        while heap and len(due) < limit:
            run_at, task_id, seq = heap[0]
            if run_at > now:
                break  # the earliest entry, stale or not: nothing live is due either
            heapq.heappop(heap)
            record = self._live(run_at, task_id, seq)
            if record is not None:
                due.append(record)
        return due

    def _due_merged(self, heaps: list[list[_ReadyEntry]], now: datetime, limit: int) -> list[Record]:
        """Up to ``limit`` live due records taken off several heaps, oldest due first."""
        due: list[Record] = []
        while len(due) < limit:
            best: list[_ReadyEntry] | None = None
            for heap in heaps:
                live = self._live_head(heap) is not None
                if live and heap[0][0] <= now and (best is None or heap[0] < best[0]):
                    best = heap
            if best is None:
                break
            due.append(self.records[heapq.heappop(best)[1]])
        return due

    def has_due(self, queue: str, now: datetime, types: tuple[str, ...] | None) -> bool:
        """Whether a ready record of ``queue`` (of ``types``; None: any) is due at ``now``."""
        return next(self.due_in_order(queue, now, types), None) is not None

    def next_run_at(self, queue: str) -> datetime | None:
        """When the earliest ready record of ``queue`` is due, or None when it has none."""
        heads = [head.run_at for head in map(self._live_head, self._heaps(queue, None)) if head is not None]
        return min(heads, default=None)

    def overdue(self, queue: str, cutoff: datetime, handled: tuple[str, ...]) -> int:
        """Ready records of ``queue`` due at or before ``cutoff``, of a type not in ``handled``."""
        count = 0
        unhandled = tuple(name for name in self._types.get(queue, ()) if name not in handled)
        for heap in self._heaps(queue, unhandled):
            count += sum(1 for entry in heap if entry[0] <= cutoff and self._live(*entry) is not None)
        return count

    def _live_head(self, heap: list[_ReadyEntry]) -> Record | None:
        """The record at the top of ``heap`` after discarding stale entries."""
        while heap:
            record = self._live(*heap[0])
            if record is not None:
                return record
            heapq.heappop(heap)
        return None

    def _live(self, run_at: datetime, task_id: str, seq: int) -> Record | None:
        """The record of a heap entry still current (ready, same seq and due time), else None."""
        record = self.records.get(task_id)  # None: pruned since
        if (
            record is not None
            and record.status in READY_STATUSES
            and record.ready_seq == seq
            and record.run_at == run_at
        ):
            return record
        return None

    # -- reads -----------------------------------------------------------------------------

    def counts(self) -> dict[str, dict[Status, int]]:
        """Type x status counts, without zero entries."""
        result: dict[str, dict[Status, int]] = {}
        for task_type, by_status in self._counts.items():
            nonzero = {status: n for status, n in by_status.items() if n}
            if nonzero:
                result[task_type] = nonzero
        return result

    def queue_length(self, queue: str) -> int:
        """Pending plus retrying tasks of ``queue``."""
        return self._queue_len.get(queue, 0)

    def waiting(self, queue: str) -> int:
        """Pending, retrying and blocked tasks of ``queue``: what back-pressure counts."""
        return self._queue_len.get(queue, 0) + self._blocked.get(queue, 0)

    def select(self, flt: Filter) -> list[Task]:
        """Snapshots matching ``flt``, sorted by ``(created_at, id)``, then offset and limit.

        A business key's executions come from its index in the order they were created,
        oldest first: that order is the replay chain's, which creation times may tie on (a
        coarse or manual clock) and ids need not follow.
        """
        if flt.business_key is not None:
            executions = (self.records[i] for i in self.by_key.get(flt.business_key, ()))
            matching = [r for r in executions if _matches(r, flt)]
        elif flt.parent is not None:
            children = (self.records.get(i) for i in dict.fromkeys(self.children.get(flt.parent, ())))
            matching = [r for r in children if r is not None and _matches(r, flt)]
            matching.sort(key=lambda r: (r.created_at, r.id))
        else:
            matching = [r for r in self.records.values() if _matches(r, flt)]
            matching.sort(key=lambda r: (r.created_at, r.id))
        end = None if flt.limit == 0 else flt.offset + flt.limit
        return [r.snapshot() for r in matching[flt.offset : end]]


def _matches(record: Record, flt: Filter) -> bool:
    return (
        (flt.type is None or record.type == flt.type)
        and (flt.queue is None or record.queue == flt.queue)
        and (flt.group is None or record.group == flt.group)
        and (flt.status is None or record.status is flt.status)
        and (flt.business_key is None or record.business_key == flt.business_key)
        and (flt.parent is None or flt.parent in record.depends_on)
    )
