"""`MemoryBroker`: the broker protocol over dicts and heaps in this process, under one lock."""

from __future__ import annotations

import builtins
import dataclasses
import itertools
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType

from taskgate.brokers.base import (
    UNSET,
    Capabilities,
    FailureKind,
    Lease,
    NewTask,
    SettledSink,
    Unset,
    check_identifier,
)
from taskgate.brokers.checks import check_count, check_queues, check_timeout
from taskgate.brokers.memory._dependencies import arrival_status, settle_children
from taskgate.brokers.memory._holds import HoldBook
from taskgate.brokers.memory._limits import Admit, SharedBook
from taskgate.brokers.memory._prune import prune_records
from taskgate.brokers.memory._quota import QuotaBook
from taskgate.brokers.memory._record import Record
from taskgate.brokers.memory._table import READY_STATUSES, TaskTable
from taskgate.brokers.params import (
    Canceled,
    Claim,
    Claimed,
    Compensation,
    Complete,
    Fail,
    Finish,
    GiveBack,
    Heartbeat,
    Hold,
    ItemAnswer,
    Prune,
    QueueQuery,
    QueueState,
    Renewal,
    Replay,
    Requeue,
    Retry,
    Settle,
    SharedLimits,
    Step,
    Submit,
    Submitted,
    check_compensations,
)
from taskgate.clock import Clock, SystemClock, utc
from taskgate.errors import (
    AlreadyFinalError,
    AlreadyReplayedError,
    BrokerError,
    CompletedNotAllowedError,
    LeaseLostError,
    QueueFullError,
    ReplayNotFinalError,
    TaskExistsError,
    TaskNotFoundError,
)
from taskgate.ids import new_id, new_tokens
from taskgate.task import Filter, Status, Task

__all__ = ["MemoryBroker"]

_CANCELED_ERROR = "canceled"


class MemoryBroker:
    """Tasks in this process's memory; thread-safe, one lock per broker.

    Every method holds one `threading.Condition` for its whole transition, so each is atomic
    with respect to every other thread. Claims pop per-queue heaps ordered by
    ``(run_at, id)``, one per priority, highest first; counts and queue lengths are
    maintained counters. Times come from ``clock`` (default: the system clock). All users
    live in one process, so quota counts, slots, rates and group limits are shared by every
    gate of the broker by construction (``shared_quota``, ``shared_limits``,
    ``group_limits``). Methods only hold the lock for in-memory work, so the runtime calls
    them on its event loop (``nonblocking=True``).
    """

    capabilities = Capabilities(shared_quota=True, shared_limits=True, group_limits=True, nonblocking=True)

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._cond = threading.Condition(threading.Lock())
        self._table = TaskTable()
        self._quota = QuotaBook()
        self._holds = HoldBook()
        self._limits = SharedBook()
        # Bumped (under the lock) whenever a queue may have new work; waiters compare.
        self._signals: defaultdict[str, int] = defaultdict(int)
        self._closed = False
        self._sink: SettledSink | None = None
        # Snapshots of the tasks the transition under way settled on its own, while a sink is
        # set; handed to it once the lock is released (`_Transition`).
        self._settled: builtins.list[Task] = []
        self._transition = _Transition(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._table.records)} tasks"
        return f"<MemoryBroker {state}>"

    # -- tasks: create ---------------------------------------------------------------------

    def submit(self, submit: Submit) -> Submitted:
        """Store ``submit.tasks`` all-or-nothing; their statuses on arrival and, unless
        ``snapshots`` is False, their snapshots, in the same order.

        Besides the protocol's errors: an id already in use, or two tasks of the batch with
        one id or one business key, raise `ValueError`.
        """
        with self._cond:
            if submit.max_pending:
                self._check_room(submit)
            records = self._store_new(submit.tasks)
            statuses = [r.status for r in records]
            if not submit.snapshots:
                return Submitted(statuses)  # no snapshot built: a third of a batch's cost
            return Submitted(statuses, [r.snapshot() for r in records])

    def _check_room(self, submit: Submit) -> None:
        """Raise `QueueFullError` when the batch would take a queue past its ``max_pending``."""
        for queue, limit, adding in submit.limited():
            waiting = self._table.waiting(queue)
            if waiting + adding > limit:
                raise QueueFullError(queue, limit, min(waiting, limit), adding)  # as SQL counts

    def _store_new(self, items: Sequence[NewTask]) -> builtins.list[Record]:
        """`submit`'s writes of ``items``; the caller holds the lock and reads the records in it."""
        now = self._now()
        records = self._build_batch(items, now)
        for record in records:
            self._table.add(record)
        self._signal(r.queue for r in records if r.status in READY_STATUSES)
        return records

    def _build_batch(self, items: Sequence[NewTask], now: datetime) -> builtins.list[Record]:
        """Records for ``items``, checked against the store and each other; changes nothing."""
        batch: dict[str, Record] = {}
        keys: set[str] = set()
        for item in items:
            self._check_new_id(item.id, batch)
            self._check_business_key(item.business_key, keys)
            parents = [self._parent(p, batch) for p in item.depends_on]
            status, error = arrival_status(parents, item.ignore_parent_failure)
            batch[item.id] = _new_record(item, now, status, error)
        return list(batch.values())

    def _check_new_id(self, task_id: str, batch: Collection[str] = ()) -> None:
        if task_id in self._table.records or task_id in batch:
            raise ValueError(f"task id {task_id!r} is already in use")

    def _check_business_key(self, key: str | None, batch_keys: set[str]) -> None:
        if key is None:
            return
        executions = self._table.by_key.get(key)
        if executions:
            newest = self._table.records[executions[-1]]
            raise TaskExistsError(key, newest.id, newest.status)
        if key in batch_keys:
            raise ValueError(f"business_key {key!r} appears twice in one submit")
        batch_keys.add(key)

    def _parent(self, parent_id: str, batch: dict[str, Record]) -> Record:
        found = batch.get(parent_id) or self._table.records.get(parent_id)
        if found is None:
            raise TaskNotFoundError(f"parent task {parent_id!r} does not exist")
        return found

    def replay(self, replay: Replay) -> Task:
        """Create execution ``replay.new_id`` re-running ``replay.execution_id`` -- and those of
        ``replay.descendants`` -- atomically with the checks; the snapshot of the first.

        Checks in this order, for each execution in turn: `TaskNotFoundError`,
        `ReplayNotFinalError`, `AlreadyReplayedError`, `CompletedNotAllowedError`; a new id in
        use: `ValueError`. Nothing is created unless every check passes.
        """
        with self._cond:
            now = self._now()
            runs = [(replay.execution_id, replay.new_id), *replay.descendants]
            olds = [self._table.find(old_id) for old_id, _ in runs]
            for old, (_, new_id) in zip(olds, runs, strict=True):
                self._check_replayable(old, replay.allow_completed)
                self._check_new_id(new_id)
            new_ids, batch = replay.new_ids, dict[str, Record]()
            for n, (old, (_, new_id)) in enumerate(zip(olds, runs, strict=True)):
                depends_on = tuple(new_ids.get(p, p) for p in old.depends_on)
                parents = [self._replay_parent(p, batch, new_ids) for p in depends_on]
                payload = replay.payload if n == 0 else UNSET
                batch[new_id] = _replay_record(old, new_id, now, payload, parents, depends_on)
            for old, record in zip(olds, batch.values(), strict=True):
                self._table.add(record)
                self._table.replayed_by[old.id] = record.id
            self._signal(r.queue for r in batch.values() if r.status in READY_STATUSES)
            return batch[replay.new_id].snapshot()

    def _replay_parent(self, parent_id: str, batch: dict[str, Record], new_ids: dict[str, str]) -> Record:
        """A parent of a replayed execution: created earlier in the same replay, or stored."""
        found = batch.get(parent_id)
        if found is not None:
            return found
        if parent_id in new_ids.values():
            raise ValueError(f"Replay.descendants lists {parent_id}'s execution before a parent of it")
        return self._parent(parent_id, batch)

    def _check_replayable(self, old: Record, allow_completed: bool) -> None:
        if not old.status.is_final:
            raise ReplayNotFinalError(f"execution {old.id} is {old.status.value}, not final")
        newer = self._table.replayed_by.get(old.id)
        if newer is not None:
            raise AlreadyReplayedError(f"execution {old.id} was already replayed by {newer}")
        if old.status is Status.COMPLETED and not allow_completed:
            raise CompletedNotAllowedError(f"execution {old.id} completed; pass allow_completed=True")

    # -- tasks: read -----------------------------------------------------------------------

    def get(self, task_id: str) -> Task:
        """The current snapshot of ``task_id``."""
        check_identifier(task_id, what="task id")
        with self._cond:
            self._check_open()
            return self._table.find(task_id).snapshot()

    def list(self, filter: Filter) -> builtins.list[Task]:
        """Tasks matching ``filter``, sorted by ``(created_at, id)``, then offset, then limit.

        With a ``business_key``, only that key's executions are read (an index), oldest first
        in the order they were created -- ``[]`` for an unknown key.
        """
        if not isinstance(filter, Filter):
            raise TypeError(f"list takes a Filter, got {type(filter).__name__}")
        if filter.business_key is not None:
            # `Filter` leaves its strings unchecked; a key no broker can store is a caller's bug.
            check_identifier(filter.business_key, what="business_key")
        with self._cond:
            self._check_open()
            return self._table.select(filter)

    def counts(self) -> dict[str, dict[Status, int]]:
        """Task counts by type and status, from maintained counters; zero counts are absent."""
        with self._cond:
            self._check_open()
            return self._table.counts()

    def queue_state(self, query: QueueQuery) -> QueueState:
        """Pending plus retrying tasks of ``query.queue`` (due or not), from a maintained
        count, ``query.quota``'s current window as claims would find it, and the tasks
        ``query.unhandled`` names (a walk over the ready heaps of the types it counts)."""
        if not isinstance(query, QueueQuery):
            raise TypeError(f"queue_state takes a QueueQuery, got {type(query).__name__}")
        with self._cond:
            self._check_open()
            now = self._now()
            queue_len = self._table.queue_length(query.queue)
            quota, unhandled = query.quota, query.unhandled
            overdue = 0
            if unhandled is not None:
                overdue = self._table.overdue(query.queue, now - unhandled.after, unhandled.handled)
            usage = None if quota is None else self._quota.usage(quota, now)
            return QueueState(queue_len, usage, self._holds.until(query.queue, now), overdue)

    def hold(self, hold: Hold) -> datetime | None:
        """Hold ``hold.queue`` (keeping a longer hold) or end its hold; its hold after the call."""
        if not isinstance(hold, Hold):
            raise TypeError(f"hold takes a Hold, got {type(hold).__name__}")
        with self._cond:
            held = self._holds.apply(hold, self._now())
            if held is None:
                self._signal([hold.queue])  # resumed: waiters may claim its due tasks now
            return held

    # -- tasks: the worker's transitions ---------------------------------------------------

    def claim(self, claim: Claim) -> Claimed:
        """Complete ``claim.acks`` (answered quietly), then lease up to ``claim.limit`` due
        tasks of ``claim.queue`` in claim order (priority, ``run_at``, id) -- one lock hold.

        With ``claim.quota``, each task leased takes one unit of the window, and the units no
        task took go back before the lock is released. With ``claim.shared``, each also takes
        a slot and a start of the queue (and of its group), per `SharedLimits`
        (`taskgate.brokers.memory._limits`); a subclass declaring less refuses what it does not
        declare (`ValueError`), changing nothing.
        """
        if claim.shared is not None:
            self._check_declared(claim.shared)
        if not claim.acks:
            with self._cond:  # nothing to settle: the plain lock, the claim's hot path
                return self._claim_due(claim, self._now(), [])
        with self._transition:
            now = self._now()
            acked: builtins.list[ItemAnswer] = []
            for ack in claim.acks:
                done = self._settle_item(ack, now)
                acked.append(done if isinstance(done, Exception) else None)
            return self._claim_due(claim, now, acked)

    def _claim_due(self, claim: Claim, now: datetime, acked: builtins.list[ItemAnswer]) -> Claimed:
        """The leasing half of `claim` (under the lock), within its limits and quota."""
        shared = claim.shared
        if shared is not None and shared.release:
            self._limits.release(claim.queue, shared.release)  # held or not: their tasks are done
        held = self._holds.until(claim.queue, now)
        if held is not None:
            return Claimed([], acked, held_until=held)
        if shared is None:
            return self._take(claim, claim.limit, now, None, acked)
        claimed, wake = self._limits.claim(
            claim,
            now,
            lambda n, admit: self._take(claim, n, now, admit, acked),
            lambda: self._table.has_due(claim.queue, now, claim.types),
        )
        if wake:
            self._signal([claim.queue])
        return claimed

    def _take(
        self, claim: Claim, limit: int, now: datetime, admit: Admit | None, acked: builtins.list[ItemAnswer]
    ) -> Claimed:
        """Lease up to ``limit`` due tasks that ``admit`` lets through, within the claim's quota."""
        quota = claim.quota
        if quota is None:
            return Claimed(self._lease_due(claim, limit, now, admit), acked)
        grant = self._quota.reserve(quota.key, quota.limit, quota.period, limit, now)
        if grant.granted <= 0:
            return Claimed([], acked, quota=grant, exhausted=True)
        leases = self._lease_due(claim, grant.granted, now, admit)
        if len(leases) < grant.granted:
            # Units are spent only for tasks leased: the rest go back within the same hold.
            self._quota.release(grant, grant.granted - len(leases))
            grant = dataclasses.replace(grant, granted=len(leases))
        return Claimed(leases, acked, quota=grant)

    def _lease_due(
        self, claim: Claim, limit: int, now: datetime, admit: Admit | None = None
    ) -> builtins.list[Lease]:
        """Lease up to ``limit`` due tasks of ``claim``'s queue and types, in claim order,
        passing over those ``admit`` refuses: a token each."""
        if admit is None:
            records = self._table.start_due(claim.queue, now, limit, claim.types)
        else:
            records = builtins.list(
                itertools.islice(
                    filter(admit, self._table.due_in_order(claim.queue, now, claim.types)), limit
                )
            )
            self._table.start(claim.queue, records)
        expires_at = now + claim.lease_ttl
        leases = []
        for record, token in zip(records, new_tokens(len(records)), strict=True):
            record.claims += 1
            record.started_at = now
            record.token = token
            record.lease_expires_at = expires_at
            leases.append(Lease(task=record.snapshot(), token=token, expires_at=expires_at))
        return leases

    def heartbeat(self, heartbeat: Heartbeat) -> Renewal:
        """Extend the lease to ``now + lease_ttl`` and report whether a cancel was requested.

        An expired lease that no reaper took back yet is still held and can be renewed.
        With ``slot_queue``, the lease's slot is renewed with it, or answered ``slot_lost``
        when it was given back or expired.
        """
        if heartbeat.slot_queue is not None and not self.capabilities.shared_limits:
            raise ValueError(f"Heartbeat.slot_queue: {self._undeclared('shared_limits')}")
        with self._cond:
            now = self._now()
            record = self._holding(heartbeat.task_id, heartbeat.token)
            expires_at = record.lease_expires_at = now + heartbeat.lease_ttl
            if heartbeat.progress is not None:
                record.progress_json = heartbeat.progress
            slot_lost = heartbeat.slot_queue is not None and not self._limits.renew(
                heartbeat.slot_queue, heartbeat.token, expires_at, now
            )
            return Renewal(expires_at, record.cancel_requested, slot_lost)

    def settle(self, settle: Settle) -> builtins.list[ItemAnswer]:
        """End the runs of ``settle.items`` in ONE lock hold, then give back its quota units;
        one answer per item, in order.

        Items are independent: an unknown id or a stale token answers its own item with
        `TaskNotFoundError`/`LeaseLostError` and changes nothing for it. An item that took
        effect answers its snapshot, or None when ``snapshots`` is False (none is built).
        """
        give_back = settle.give_back
        if give_back is not None and give_back.slots and not self.capabilities.shared_limits:
            raise ValueError(f"GiveBack.slots: {self._undeclared('shared_limits')}")
        with self._transition:
            now = self._now()
            answers: builtins.list[ItemAnswer] = []
            for item in settle.items:
                done = self._settle_item(item, now)
                if isinstance(done, Exception):
                    answers.append(done)
                else:  # the snapshot inside the lock, before anything else can change the record
                    answers.append(done.snapshot() if settle.snapshots else None)
            if give_back is not None:
                self._give_back(give_back)
            return answers

    def _settle_item(self, item: Finish, now: datetime) -> Record | LeaseLostError | TaskNotFoundError:
        """Apply one settle item (under the lock): its record, or the error it alone met."""
        try:
            record = self._holding(item.task_id, item.token)
        except (LeaseLostError, TaskNotFoundError) as exc:
            return exc
        if type(item) is Complete:  # the hot path first: most runs end in a completion
            # A cancel mark does not stop a completion: the work is done, so the task completes.
            record.result = item.result
            self._finish(record, Status.COMPLETED, now)
        elif isinstance(item, Retry):
            # Cancel requested meanwhile: the failure still counts, and the task is canceled.
            _count_failure(record, item.kind, item.error, item.traceback)
            if item.hold_queue:
                self._holds.extend(record.queue, now + item.delay)
            if record.cancel_requested:
                self._finish(record, Status.CANCELED, now)
            else:
                record.run_at = now + item.delay
                self._table.set_status(record, Status.RETRYING)
                self._signal([record.queue])
        elif isinstance(item, Fail):
            _count_failure(record, item.kind, item.error, item.traceback)
            self._finish(record, Status.FAILED, now)
            if item.compensation is not None:
                self._compensate(record, item.compensation)
        elif isinstance(item, Requeue):
            self._back_to_pending_or_cancel(record, now)
        else:
            assert isinstance(item, Canceled)
            record.last_error = _CANCELED_ERROR
            self._finish(record, Status.CANCELED, now)
        return record

    def _compensate(self, failed: Record, compensation: Compensation) -> None:
        """Submit ``compensation`` for the task ``failed`` just failed, in the same lock hold."""
        self._store_new([compensation.task(failed.id, new_id())])

    def _give_back(self, give_back: GiveBack) -> None:
        """Return each grant's units to the window it came from (never below 0) and the slots
        to their queue (under the lock)."""
        for grant, n in give_back.quota:
            self._quota.release(grant, n)
        if give_back.queue is not None and give_back.slots:
            self._limits.release(give_back.queue, give_back.slots)

    def _holding(self, task_id: str, token: str) -> Record:
        """The record of ``task_id`` if ``token`` is its current lease, else `LeaseLostError`."""
        record = self._table.find(task_id)
        if record.status is not Status.RUNNING or record.token is None:
            raise LeaseLostError(f"task {task_id} is {record.status.value}; the lease is gone")
        if not secrets.compare_digest(record.token, token):
            raise LeaseLostError(f"task {task_id} is held under another lease")
        return record

    # -- tasks: anyone's transitions -------------------------------------------------------

    def cancel(self, task_id: str) -> Task:
        """Cancel a task.

        blocked/pending/retrying: ``canceled`` at once, with its descendants (cascade).
        running: only marked (again: no error); the holder sees it on its next heartbeat.
        Final: raises `AlreadyFinalError`.
        """
        check_identifier(task_id, what="task id")
        with self._transition:
            now = self._now()
            record = self._table.find(task_id)
            if record.status.is_final:
                raise AlreadyFinalError(f"task {task_id} is already {record.status.value}")
            if record.status is Status.RUNNING:
                record.cancel_requested = True
            else:
                record.last_error = _CANCELED_ERROR
                self._finish(record, Status.CANCELED, now)
            return record.snapshot()

    def prune(self, prune: Prune) -> int:
        """Delete up to ``prune.limit`` final tasks it names (see `Broker.prune`), oldest stored
        first; how many were deleted."""
        if not isinstance(prune, Prune):
            raise TypeError(f"prune takes a Prune, got {type(prune).__name__}")
        with self._cond:
            self._check_open()
            return prune_records(self._table, prune, self._now())

    def step(self, step: Step) -> bytes | None:
        """Read step ``step.name`` of ``step.task_id``, or store ``step.result`` unless one is
        stored (the first writer wins); the result stored after the call, None when none is.
        Kept on the task's record: it goes with the record."""
        if not isinstance(step, Step):
            raise TypeError(f"step takes a Step, got {type(step).__name__}")
        with self._cond:
            self._check_open()
            record = self._table.find(step.task_id)
            stored = None if record.steps is None else record.steps.get(step.name)
            if stored is not None or step.result is None:
                return stored
            if record.steps is None:
                record.steps = {}
            record.steps[step.name] = step.result
            return step.result

    def reap(
        self,
        *,
        lease_lost_max: int,
        limit: int = 1000,
        compensations: Mapping[str, Compensation] | None = None,
    ) -> builtins.list[Task]:
        """Take back up to ``limit`` running tasks whose lease ended (``expires_at <= now``).

        Earliest expiry first. Each gets ``lease_lost += 1``; then a cancel-marked task is
        canceled, a task at ``lease_lost_max`` fails (submitting its type's entry of
        ``compensations``, if any), any other goes back to ``pending`` due now.
        """
        check_count(lease_lost_max, what="lease_lost_max", minimum=1)
        check_count(limit, what="reap limit", minimum=1)
        compensate = check_compensations(compensations)
        with self._transition:
            now = self._now()
            expired = [
                r for r in self._running() if r.lease_expires_at is not None and r.lease_expires_at <= now
            ]
            expired.sort(key=lambda r: (r.lease_expires_at, r.id))
            return [self._reap_one(r, now, lease_lost_max, compensate) for r in expired[:limit]]

    def _running(self) -> Iterable[Record]:
        return (self._table.records[i] for i in self._table.running)

    def _reap_one(
        self, record: Record, now: datetime, lease_lost_max: int, compensations: Mapping[str, Compensation]
    ) -> Task:
        record.lease_lost += 1
        if record.lease_lost >= lease_lost_max and not record.cancel_requested:
            record.last_error = f"lease lost {record.lease_lost} times (lease_lost_max={lease_lost_max})"
            self._finish(record, Status.FAILED, now)
            compensation = compensations.get(record.type)
            if compensation is not None:
                self._compensate(record, compensation)
        else:
            self._back_to_pending_or_cancel(record, now)
        return record.snapshot()

    def _back_to_pending_or_cancel(self, record: Record, now: datetime) -> None:
        if record.cancel_requested:
            record.last_error = _CANCELED_ERROR
            self._finish(record, Status.CANCELED, now)
            return
        record.run_at = now
        self._table.set_status(record, Status.PENDING)
        self._signal([record.queue])

    def _finish(self, record: Record, status: Status, now: datetime) -> None:
        """Make ``record`` final and settle its dependants in the same lock hold."""
        record.finished_at = now
        self._table.set_status(record, status)
        woken = settle_children(self._table, record, now)
        if woken:
            self._signal(r.queue for r in woken if r.status in READY_STATUSES)
            if self._sink is not None:
                self._settled.extend(r.snapshot() for r in woken)

    def report_settled(self, sink: SettledSink | None) -> None:
        """Give ``sink`` the snapshots of the tasks each later call settles on its own (see
        `taskgate.brokers.base.Broker.report_settled`); None stops it."""
        with self._cond:
            self._sink = sink

    # -- wake-ups and lifecycle -------------------------------------------------------------

    def wait_for_work(self, queues: Collection[str], timeout: float) -> bool:
        """Block up to ``timeout`` seconds until work may be due in ``queues``.

        True at once when a task of ``queues`` is due already (so work submitted between a
        claim and this wait is never missed); else True when a submit/requeue/retry/wake-up
        touches one of ``queues`` or the earliest delayed task falls due (by the broker's
        clock, measured when the wait began). False on timeout, and at once or on wake-up
        once the broker is closed.
        """
        names = check_queues(queues)
        seconds = check_timeout(timeout)
        deadline = time.monotonic() + seconds
        with self._cond:
            if self._closed:
                return False
            seen = [self._signals.get(q, 0) for q in names]
            due_at = self._monotonic_due(names)
            if due_at is not None and due_at <= time.monotonic():
                return True
            wake_at = deadline if due_at is None else min(deadline, due_at)
            while not self._closed:
                if [self._signals.get(q, 0) for q in names] != seen:
                    return True
                remaining = wake_at - time.monotonic()
                if remaining <= 0:
                    return wake_at < deadline
                self._cond.wait(remaining)
            return False

    def _monotonic_due(self, queues: builtins.list[str]) -> float | None:
        """When, on ``time.monotonic``, the earliest ready task of ``queues`` is due (maybe past)."""
        now = utc(self._clock.now())
        run_ats = [t for t in (self._table.next_run_at(q) for q in queues) if t is not None]
        if not run_ats:
            return None
        return time.monotonic() + (min(run_ats) - now).total_seconds()

    @property
    def clock(self) -> Clock:
        """The clock this broker reads (the one given at construction, else the system clock)."""
        return self._clock

    def close(self) -> None:
        """Wake every waiter; later calls raise `BrokerError` (waits return False). Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- helpers ---------------------------------------------------------------------------

    def _check_declared(self, shared: SharedLimits) -> None:
        """Refuse the shared limits this broker's class does not declare (a subclass may
        declare less: then it is held to the protocol's refusals)."""
        capabilities = self.capabilities
        if not capabilities.shared_limits:
            raise ValueError(f"Claim.shared: {self._undeclared('shared_limits')}")
        if shared.grouped and not capabilities.group_limits:
            raise ValueError(f"Claim.shared sets group limits: {self._undeclared('group_limits')}")

    def _undeclared(self, capability: str) -> str:
        return f"{type(self).__name__} does not declare capabilities.{capability}"

    def _now(self) -> datetime:
        """The clock's time, after checking the broker is open (call under the lock)."""
        self._check_open()
        return utc(self._clock.now())

    def _check_open(self) -> None:
        if self._closed:
            raise BrokerError("MemoryBroker is closed")

    def _signal(self, queues: Iterable[str]) -> None:
        """Tell waiters that ``queues`` may have work (call under the lock)."""
        touched = False
        for queue in queues:
            self._signals[queue] += 1
            touched = True
        if touched:
            self._cond.notify_all()


class _Transition:
    """The lock held for one transition that may settle tasks (``with broker._transition:``):
    what it settled goes to the sink once the lock is released, unless the transition raised."""

    __slots__ = ("_broker",)

    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker

    def __enter__(self) -> None:
        self._broker._cond.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        broker = self._broker
        settled, sink = broker._settled, broker._sink
        if settled:
            broker._settled = []
        broker._cond.release()
        if settled and sink is not None and kind is None:
            sink(settled)


def _new_record(item: NewTask, now: datetime, status: Status, error: str | None) -> Record:
    run_at = utc(item.run_at) if item.run_at is not None else now + (item.delay or timedelta(0))
    return Record(
        id=item.id,
        type=item.type,
        queue=item.queue,
        payload=item.payload,
        status=status,
        created_at=now,
        run_at=run_at,
        max_retry=item.max_retry,
        depends_on=item.depends_on,
        ignore_parent_failure=item.ignore_parent_failure,
        business_key=item.business_key,
        replay_of=None,
        timeout=item.timeout,
        group=item.group,
        last_error=error,
        finished_at=now if status.is_final else None,
        trace_context=item.trace_context,
        priority=item.priority,
    )


def _replay_record(
    old: Record,
    new_id: str,
    now: datetime,
    payload: bytes | Unset | None,
    parents: builtins.list[Record],
    depends_on: tuple[str, ...],
) -> Record:
    status, error = arrival_status(parents, old.ignore_parent_failure)
    return Record(
        id=new_id,
        type=old.type,
        queue=old.queue,
        payload=old.payload if isinstance(payload, Unset) else payload,
        status=status,
        created_at=now,
        run_at=now,
        max_retry=old.max_retry,
        depends_on=depends_on,
        ignore_parent_failure=old.ignore_parent_failure,
        business_key=old.business_key,
        replay_of=old.id,
        timeout=old.timeout,
        group=old.group,
        last_error=error,
        finished_at=now if status.is_final else None,
        priority=old.priority,
    )


def _count_failure(record: Record, kind: FailureKind, error: str, traceback: str | None) -> None:
    if kind is FailureKind.THROTTLED:
        record.throttled += 1
    else:
        record.attempts += 1
    record.last_error = error
    record.last_traceback = traceback
