"""The parameter objects of the broker verbs, and their answers.

Each verb takes ONE frozen object that checks itself on construction: bad input raises a
`TypeError`/`ValueError` naming the field before a broker sees it, so no broker repeats the
checks, and a new option (a priority, a group, a shared limit) is a new field with a default,
not a new method. Answers are plain frozen records too.

Verbs and objects: `Broker.submit` takes `Submit`; `Broker.claim` takes `Claim` (with a
`QuotaSpec`, `SharedLimits` and acks to carry); `Broker.settle` takes `Settle` (`Complete`,
`Retry`, `Fail`, `Requeue` and `Canceled` items, and a `GiveBack`); `Broker.heartbeat` takes
`Heartbeat`; `Broker.replay` takes `Replay`; `Broker.queue_state` takes `QueueQuery` (with
`Unhandled`) and answers `QueueState` (with the figures of a quota's window, `QuotaUsage`);
`Broker.hold` takes `Hold`; `Broker.prune` takes `Prune`; `Broker.step` takes `Step`.

A queue's hold (a pause by hand, or a queue-wide throttle: ``Retry.hold_queue``) is one time per
queue, on the medium's clock, before which no claim leases its tasks (`Claimed.held_until`
answers it); a queue paused until resumed reads as `HELD_INDEFINITELY`. A hold never shortens a
longer one; only a resume (``Hold(resume=True)``) ends a hold early.

Where the coming features go: a priority or a group is a `NewTask` field and enters the claim
order or `SharedLimits` (group slots and rates beside the queue's); shared limits on SQL are
the broker honouring `Claim.shared`; a queue-wide hold is a field of `Retry` (hold the queue
too) and of `Claim` (answered as held); a step of a pipeline is a `Complete` that submits the
next task in the same unit; a queue's quota figures are a field of `QueueQuery` (what
replaced reading a queue's length). What is a new verb (about four in all): holding and
resuming a queue by hand (`Broker.hold`, done), pruning finished tasks (`Broker.prune`, done:
the reaper's retention and `Gate.purge` alike), a handler's durable steps (`Broker.step`,
done: read or store once), and a submit inside the application's own transaction.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from taskgate.brokers.base import (
    MAX_DELAY,
    UNSET,
    FailureKind,
    Lease,
    NewTask,
    QuotaGrant,
    QuotaSpec,
    Unset,
    check_identifier,
    is_identifier,
)
from taskgate.brokers.checks import storable_error, storable_traceback
from taskgate.errors import BrokerError, LeaseLostError, TaskNotFoundError
from taskgate.task import FINAL_STATUSES, Status, Task

__all__ = [
    "HELD_INDEFINITELY",
    "MAX_PROGRESS_BYTES",
    "MAX_STEP_BYTES",
    "Canceled",
    "Claim",
    "Claimed",
    "Compensation",
    "Complete",
    "Fail",
    "Finish",
    "GiveBack",
    "Heartbeat",
    "Hold",
    "ItemAnswer",
    "Prune",
    "QueueQuery",
    "QueueState",
    "QuotaUsage",
    "Renewal",
    "Replay",
    "Requeue",
    "Retry",
    "Settle",
    "SharedLimits",
    "Step",
    "Submit",
    "Submitted",
    "Unhandled",
    "check_compensations",
    "check_progress",
    "compensation_payload",
]

# The hold of a queue paused until resumed: later than any time a clock reads.
HELD_INDEFINITELY = datetime.max.replace(tzinfo=UTC)

# One settled item's answer: its snapshot (None when `Settle.snapshots` is False), or the error
# that item alone met -- the lease is no longer this token's, or the task is gone.
ItemAnswer = Task | LeaseLostError | TaskNotFoundError | None


def _count(value: object, *, what: str, minimum: int) -> int:
    if type(value) is int and value >= minimum:
        return value  # the common case first: these run on every claim
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def _duration(value: object, *, what: str, positive: bool, maximum: timedelta | None = None) -> None:
    if not isinstance(value, timedelta):
        raise TypeError(f"{what} must be a timedelta, got {value!r}")
    if value < timedelta(0) or (positive and value == timedelta(0)):
        raise ValueError(f"{what} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{what} must be at most {maximum.days} days, got {value!r}")


def _rate(value: object, *, what: str) -> None:
    if (type(value) is float or type(value) is int) and 0 <= value < math.inf:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number, got {value!r}")
    if not 0 <= value < math.inf:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")


def _lease_ref(task_id: object, token: object, what: str) -> None:
    # The message names its item, so it is built only for an item that fails: this runs per ack.
    if not is_identifier(task_id):
        check_identifier(task_id, what=f"task id of {what}")
    if not isinstance(token, str):
        raise TypeError(f"lease token of {what} must be a str, got {type(token).__name__}")


def _tuple_of(value: object, kinds: type | tuple[type, ...], *, what: str) -> tuple[object, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{what} must be a sequence, got {type(value).__name__}")
    items = tuple(value)
    for n, item in enumerate(items):
        if not isinstance(item, kinds):
            raise TypeError(f"{what}[{n}] has the wrong type: {type(item).__name__}")
    return items


def _types(value: object, *, what: str) -> tuple[str, ...]:
    """A sequence of task types as a sorted tuple without repeats (so equal sets of types
    make equal parameters), each checked like `NewTask.type`."""
    if type(value) is tuple and all(map(is_identifier, value)) and list(value) == sorted(set(value)):
        return value  # the runtime's own, built once per set of handlers: a claim's hot path
    items = _tuple_of(value, str, what=what)
    for item in items:
        check_identifier(item, what=f"{what} item")
    return tuple(sorted(set(items)))  # type: ignore[arg-type]


# -- submit ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    """Tasks to store, all or nothing; see `Broker.submit`.

    ``snapshots=False``: answer only each task's status on arrival (for callers that look at
    nothing else), so the broker need not build the snapshots.

    ``max_pending``: (queue, limit) pairs, sorted by queue, each limit >= 1 (back-pressure,
    ``QueueConfig.max_pending``). For each such queue the batch names, the broker counts the
    queue's pending, retrying and blocked tasks in the same unit as the insert; when they
    plus the batch's tasks of that queue (every one, whatever its status on arrival) would
    exceed the limit it raises `QueueFullError` and stores nothing. Empty: no count is made.
    """

    tasks: tuple[NewTask, ...]
    snapshots: bool = True
    max_pending: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.tasks, NewTask):
            raise TypeError("Submit.tasks takes a sequence of NewTask, not a single NewTask")
        object.__setattr__(self, "tasks", _tuple_of(self.tasks, NewTask, what="Submit.tasks"))
        if self.max_pending:
            object.__setattr__(self, "max_pending", _limits(self.max_pending))

    def limited(self) -> list[tuple[str, int, int]]:
        """(queue, limit, tasks of the batch in it) for each queue of ``max_pending`` the batch
        names, by queue: what a broker checks before it stores the batch."""
        if not self.max_pending:
            return []
        adding: dict[str, int] = {}
        for task in self.tasks:
            adding[task.queue] = adding.get(task.queue, 0) + 1
        return [(queue, limit, adding[queue]) for queue, limit in self.max_pending if queue in adding]


def _limits(value: object) -> tuple[tuple[str, int], ...]:
    """``Submit.max_pending`` checked: (queue, limit >= 1) pairs, sorted, each queue once."""
    if type(value) is tuple and len(value) == 1:  # the runtime's: one queue, on every submit
        pair = value[0]
        if type(pair) is tuple and len(pair) == 2 and is_identifier(pair[0]) and type(pair[1]) is int:
            if pair[1] >= 1:
                return value
    pairs = _tuple_of(value, tuple, what="Submit.max_pending")
    for n, pair in enumerate(pairs):
        assert isinstance(pair, tuple)
        if len(pair) != 2:
            raise ValueError(f"Submit.max_pending[{n}] must be a (queue, limit) pair, got {pair!r}")
        check_identifier(pair[0], what=f"Submit.max_pending[{n}] queue")
        _count(pair[1], what=f"Submit.max_pending[{n}] limit", minimum=1)
    queues = [pair[0] for pair in pairs]  # type: ignore[index]
    if queues != sorted(set(queues)):
        raise ValueError(f"Submit.max_pending must be sorted by queue, each queue once, got {value!r}")
    return pairs  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Submitted:
    """What `Broker.submit` stored: each task's status on arrival and, when asked, its snapshot."""

    statuses: list[Status]
    tasks: list[Task] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Replay:
    """A new execution ``new_id`` re-running ``execution_id``; see `Broker.replay`.

    ``payload`` replaces the old payload when given (None clears it). ``descendants``: pairs
    (old id, new id) of final tasks to re-run in the same unit, in order, each after the ones
    it depends on: each new one copies its old one (payload included) but depends on the new
    executions of those of its parents re-run here -- ``execution_id`` and earlier pairs -- and
    on its other parents as they are (a failed pipeline's canceled stages, re-run after the
    stage that failed). Every old id is checked as ``execution_id`` is.
    """

    execution_id: str
    new_id: str
    allow_completed: bool = False
    payload: bytes | Unset | None = UNSET
    descendants: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        check_identifier(self.execution_id, what="execution id")
        check_identifier(self.new_id, what="new id")
        if not (self.payload is None or isinstance(self.payload, bytes | Unset)):
            raise TypeError(f"payload must be bytes or None, got {type(self.payload).__name__}")
        if self.descendants:
            object.__setattr__(self, "descendants", _replay_pairs(self))

    @property
    def new_ids(self) -> dict[str, str]:
        """Each old id re-run here (``execution_id`` first) -> its new execution's id."""
        return {self.execution_id: self.new_id, **dict(self.descendants)}


def _replay_pairs(replay: Replay) -> tuple[tuple[str, str], ...]:
    pairs = _tuple_of(replay.descendants, tuple, what="Replay.descendants")
    old_ids, new_ids = {replay.execution_id}, {replay.new_id}
    for n, pair in enumerate(pairs):
        assert isinstance(pair, tuple)
        if len(pair) != 2:
            raise ValueError(f"Replay.descendants[{n}] must be an (old id, new id) pair, got {pair!r}")
        old_id: str = pair[0]
        new_id: str = pair[1]
        check_identifier(old_id, what=f"Replay.descendants[{n}] old id")
        check_identifier(new_id, what=f"Replay.descendants[{n}] new id")
        if {old_id, new_id} & (old_ids | new_ids) or old_id == new_id:
            raise ValueError(f"Replay.descendants[{n}] repeats an id: {pair!r}")
        old_ids.add(old_id)
        new_ids.add(new_id)
    return pairs  # type: ignore[return-value]


# -- queue state -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Unhandled:
    """Which of a queue's tasks `QueueState.unhandled` counts: pending or retrying, due for
    longer than ``after`` (``run_at <= now - after``), of a type not in ``handled``.

    ``handled``: the types the asking process has handlers for in the queue (sorted, without
    repeats); empty counts every type -- a process with no handler (a web process) cannot
    tell which types other processes handle.
    """

    after: timedelta
    handled: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _duration(self.after, what="Unhandled.after", positive=False, maximum=MAX_DELAY)
        object.__setattr__(self, "handled", _types(self.handled, what="Unhandled.handled"))


@dataclass(frozen=True, slots=True)
class QueueQuery:
    """What to read of ``queue``; see `Broker.queue_state`.

    ``quota``: also read the figures of that budget's current window (`QuotaUsage`).
    ``unhandled``: also count the tasks it names (`QueueState.unhandled`).
    """

    queue: str
    quota: QuotaSpec | None = None
    unhandled: Unhandled | None = None

    def __post_init__(self) -> None:
        check_identifier(self.queue, what="QueueQuery.queue")
        if self.quota is not None and not isinstance(self.quota, QuotaSpec):
            raise TypeError(f"QueueQuery.quota must be a QuotaSpec, got {type(self.quota).__name__}")
        if self.unhandled is not None and not isinstance(self.unhandled, Unhandled):
            raise TypeError(f"QueueQuery.unhandled must be Unhandled, got {type(self.unhandled).__name__}")


@dataclass(frozen=True, slots=True)
class QuotaUsage:
    """A quota key's current window as the medium holds it: ``used`` of ``limit`` units.

    The window is ``[window_start, window_end)``, epoch-aligned on the medium's clock; a window
    nothing was taken from yet has ``used`` 0. ``used`` never exceeds ``limit``. A window older
    than the newest one kept (the medium's clock stepped back) has ``used == limit``: claims get
    nothing from it either.
    """

    key: str
    limit: int
    used: int
    window_start: datetime
    window_end: datetime


@dataclass(frozen=True, slots=True)
class QueueState:
    """What `Broker.queue_state` read: ``queue_len`` (pending + retrying, due or not), when a
    quota was asked its window's figures, ``held_until``: the queue's hold when it is held
    (`HELD_INDEFINITELY` until resumed), else None, and when `QueueQuery.unhandled` was given
    the number of tasks it names (else 0)."""

    queue_len: int
    quota: QuotaUsage | None = None
    held_until: datetime | None = None
    unhandled: int = 0


# -- hold --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hold:
    """Hold ``queue`` -- no claim leases its tasks until the hold ends -- or end its hold; see
    `Broker.hold`.

    ``for_``: hold it until ``now + for_`` (> 0, at most `MAX_DELAY`), or until resumed when
    None; a longer hold already set is kept. ``resume=True``: end the queue's hold now, whatever
    set it (``for_`` must then be None).
    """

    queue: str
    for_: timedelta | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        check_identifier(self.queue, what="Hold.queue")
        if not isinstance(self.resume, bool):
            raise TypeError(f"Hold.resume must be a bool, got {self.resume!r}")
        if self.for_ is not None:
            _duration(self.for_, what="Hold.for_", positive=True, maximum=MAX_DELAY)
            if self.resume:
                raise ValueError(f"Hold.for_ must be None with resume=True, got {self.for_!r}")


# -- prune -------------------------------------------------------------------------------

# The most tasks one prune deletes: a bounded unit, however many are due to go.
MAX_PRUNE = 10_000


@dataclass(frozen=True, slots=True)
class Prune:
    """Delete up to ``limit`` final tasks; see `Broker.prune`.

    ``statuses``: which final statuses go (at least one; a status that is not final is refused,
    naming it). ``older_than``: only tasks that finished at least that long before the medium's
    now (0: every one finished by now). ``queues`` (None: any queue), ``exclude_queues`` (the
    queues a retention of their own covers), ``type`` and ``group`` narrow it further.
    """

    statuses: tuple[Status, ...]
    older_than: timedelta = timedelta(0)
    queues: tuple[str, ...] | None = None
    type: str | None = None
    group: str | None = None
    limit: int = 500
    exclude_queues: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.statuses, str):
            raise TypeError("Prune.statuses takes a sequence of statuses, not a single one")
        statuses = tuple(
            Status(str(s)) for s in _tuple_of(self.statuses, (Status, str), what="Prune.statuses")
        )
        if not statuses:
            raise ValueError("Prune.statuses must name at least one final status")
        for status in statuses:
            if status not in FINAL_STATUSES:
                raise ValueError(f"Prune.statuses: {status.value} is not final; only final tasks are deleted")
        object.__setattr__(self, "statuses", tuple(sorted(set(statuses))))
        _duration(self.older_than, what="Prune.older_than", positive=False, maximum=MAX_DELAY)
        if self.queues is not None:
            queues = _tuple_of(self.queues, str, what="Prune.queues")
            for queue in queues:
                check_identifier(queue, what="Prune.queues item")
            if not queues:
                raise ValueError("Prune.queues must name at least one queue (None: any queue)")
            object.__setattr__(self, "queues", tuple(sorted(set(queues))))
        excluded = _tuple_of(self.exclude_queues, str, what="Prune.exclude_queues")
        for queue in excluded:
            check_identifier(queue, what="Prune.exclude_queues item")
        object.__setattr__(self, "exclude_queues", tuple(sorted(set(excluded))))
        if self.type is not None:
            check_identifier(self.type, what="Prune.type")
        if self.group is not None:
            check_identifier(self.group, what="Prune.group")
        if _count(self.limit, what="Prune.limit", minimum=1) > MAX_PRUNE:
            raise ValueError(f"Prune.limit must be at most {MAX_PRUNE}, got {self.limit}")


# -- step --------------------------------------------------------------------------------

# The largest step result stored, in bytes of its JSON: room for a gateway's answer, and well
# inside what every backend takes in one value (MySQL's packet, Redis's bulk string).
MAX_STEP_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Step:
    """Read the stored result of step ``name`` of task ``task_id``, or store one; see
    `Broker.step`.

    ``result=None`` reads. ``result`` (the step's JSON, at most `MAX_STEP_BYTES`) stores it
    unless a result of that name is stored already: the first writer wins.
    """

    task_id: str
    name: str
    result: bytes | None = None

    def __post_init__(self) -> None:
        check_identifier(self.task_id, what="task id")
        check_identifier(self.name, what="step name")
        if self.result is not None:
            if not isinstance(self.result, bytes):
                raise TypeError(
                    f"result of step {self.name!r} must be bytes or None, got {type(self.result).__name__}"
                )
            if len(self.result) > MAX_STEP_BYTES:
                raise ValueError(
                    f"result of step {self.name!r} is {len(self.result)} bytes of JSON; "
                    f"at most {MAX_STEP_BYTES} allowed"
                )


# -- claim -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SharedLimits:
    """A queue's limits counted across every process of the broker (``shared_limits``).

    ``workers`` slots at once (each claimed lease holds one, under its lease's token, until it
    is given back -- `GiveBack.slots`, or a later claim's ``release`` -- or expires with the
    lease); ``rps`` starts a second with bursts of
    ``burst`` (0: no rate). ``release`` names slots to give back first, so they count as free
    for this claim. A ``claimer`` id makes claimers take turns: one that found no free slot
    while tasks were due is owed one, which every other claimer leaves free until it came back.

    Each group of the queue (`NewTask.group`) is limited on its own too (brokers declaring
    ``group_limits``; 0: no such limit): ``group_workers`` of the queue's slots at once,
    ``group_rps`` starts a second with bursts of ``group_burst``, and ``group_quota_limit``
    starts per epoch-aligned ``group_quota_period``. A claim passes over the tasks of a group
    at its limit -- they never hold up another group's -- and tasks without a group count
    against the queue's limits only.
    """

    workers: int
    rps: float = 0.0
    burst: int = 0
    release: tuple[str, ...] = ()
    claimer: str = ""
    group_workers: int = 0
    group_rps: float = 0.0
    group_burst: int = 0
    group_quota_limit: int = 0
    group_quota_period: timedelta | None = None

    def __post_init__(self) -> None:
        _count(self.workers, what="SharedLimits.workers", minimum=1)
        _rate(self.rps, what="SharedLimits.rps")
        _count(self.burst, what="SharedLimits.burst", minimum=0)
        release = self.release
        if type(release) is not tuple or not all(type(token) is str for token in release):
            # (the runtime's own tuple of str, made once per claim, skips the general check)
            object.__setattr__(self, "release", _tuple_of(release, str, what="SharedLimits.release"))
        if not isinstance(self.claimer, str):
            raise TypeError(f"SharedLimits.claimer must be a str, got {type(self.claimer).__name__}")
        _count(self.group_workers, what="SharedLimits.group_workers", minimum=0)
        _rate(self.group_rps, what="SharedLimits.group_rps")
        _count(self.group_burst, what="SharedLimits.group_burst", minimum=0)
        _count(self.group_quota_limit, what="SharedLimits.group_quota_limit", minimum=0)
        if self.group_quota_period is not None:
            _duration(self.group_quota_period, what="SharedLimits.group_quota_period", positive=True)
        if self.group_quota_limit and self.group_quota_period is None:
            raise ValueError("SharedLimits.group_quota_limit needs a group_quota_period")

    @property
    def grouped(self) -> bool:
        """Whether any group limit is set."""
        return bool(self.group_workers or self.group_rps or self.group_quota_limit)


@dataclass(frozen=True, slots=True)
class Complete:
    """Complete a running task with ``result``."""

    task_id: str
    token: str
    result: bytes | None = None

    def __post_init__(self) -> None:
        _lease_ref(self.task_id, self.token, "Complete")
        if self.result is not None and not isinstance(self.result, bytes):
            raise TypeError(f"result must be bytes or None, got {type(self.result).__name__}")


@dataclass(frozen=True, slots=True)
class Claim:
    """Lease up to ``limit`` due tasks of ``queue`` for ``lease_ttl``; see `Broker.claim`.

    ``quota``: each task claimed also takes one unit of that window. ``shared``: each also
    takes one of the queue's shared slots and starts (brokers declaring ``shared_limits``).
    ``acks``: completions to write first, in the same call (a child they make ready may be
    claimed by it). ``types``: lease only tasks of these types (sorted, without repeats; at
    least one) -- the ones the claiming process has handlers for; None leases any type.
    """

    queue: str
    limit: int
    lease_ttl: timedelta
    quota: QuotaSpec | None = None
    shared: SharedLimits | None = None
    acks: tuple[Complete, ...] = ()
    types: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_identifier(self.queue, what="queue")
        _count(self.limit, what="claim limit", minimum=1)
        _duration(self.lease_ttl, what="lease_ttl", positive=True)
        if self.quota is not None and not isinstance(self.quota, QuotaSpec):
            raise TypeError(f"Claim.quota must be a QuotaSpec, got {type(self.quota).__name__}")
        if self.shared is not None and not isinstance(self.shared, SharedLimits):
            raise TypeError(f"Claim.shared must be SharedLimits, got {type(self.shared).__name__}")
        if type(self.acks) is not tuple or any(type(a) is not Complete for a in self.acks):
            object.__setattr__(self, "acks", _tuple_of(self.acks, Complete, what="Claim.acks"))
        if self.types is not None:
            types = _types(self.types, what="Claim.types")
            if not types:
                raise ValueError("Claim.types must name at least one type (None: any type)")
            object.__setattr__(self, "types", types)


@dataclass(frozen=True, slots=True)
class Claimed:
    """What `Broker.claim` did.

    ``acked``: one answer per `Claim.acks` item, in order (None: completed). ``quota``: the
    units the leases took (``granted == len(leases)``) when a quota was asked, with
    ``exhausted`` True when its window had none left at all (wait for ``window_end``).
    ``retry_after`` > 0: the shared rate held due tasks back for that many seconds.
    ``failed``: the acks were written but the claim then failed (no leases); a broker whose
    call is one transaction raises instead, having written nothing. ``held_until``: the queue
    is held until then (`HELD_INDEFINITELY`: until resumed) -- nothing was leased, nor any
    unit, slot or start spent; the acks were written all the same.
    """

    leases: list[Lease]
    acked: list[ItemAnswer] = field(default_factory=list)
    quota: QuotaGrant | None = None
    exhausted: bool = False
    retry_after: float = 0.0
    failed: BrokerError | None = None
    held_until: datetime | None = None


# -- settle ------------------------------------------------------------------------------


def _failure(kind: object, error: object, what: str) -> None:
    if not isinstance(kind, FailureKind):
        raise TypeError(f"{what}.kind must be a FailureKind, got {kind!r}")
    if not isinstance(error, str):
        raise TypeError(f"{what}.error must be a str, got {type(error).__name__}")


def _traceback(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what}.traceback must be a str or None, got {type(value).__name__}")
    return storable_traceback(value)


@dataclass(frozen=True, slots=True)
class Retry:
    """Count a failure by ``kind`` and make the task due again after ``delay``.

    ``error`` is stored as `storable_error` makes it. ``hold_queue``: also hold the task's
    queue until ``now + delay`` in the same unit (a queue-wide throttle), keeping a longer
    hold already set -- also when a cancel requested meanwhile cancels the task instead;
    a stale token holds nothing. ``traceback`` becomes the task's ``last_traceback`` (None
    clears it), stored as `storable_traceback` makes it: its newest 8 KiB.
    """

    task_id: str
    token: str
    kind: FailureKind
    error: str
    delay: timedelta = timedelta(0)
    hold_queue: bool = False
    traceback: str | None = None

    def __post_init__(self) -> None:
        _lease_ref(self.task_id, self.token, "Retry")
        _failure(self.kind, self.error, "Retry")
        _duration(self.delay, what="Retry.delay", positive=False, maximum=MAX_DELAY)
        if not isinstance(self.hold_queue, bool):
            raise TypeError(f"Retry.hold_queue must be a bool, got {self.hold_queue!r}")
        object.__setattr__(self, "error", storable_error(self.error))
        object.__setattr__(self, "traceback", _traceback(self.traceback, "Retry"))


def compensation_payload(failed_id: str) -> bytes:
    """The payload of a compensation task: ``{"failed": <the failed task's id>}`` as compact JSON."""
    return json.dumps({"failed": failed_id}, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Compensation:
    """The task a broker submits when a task fails for good, in the same unit as the failure
    (`Fail.compensation`, and `Broker.reap`'s ``compensations`` for a task failed by lease loss).

    The new task has a fresh id, type ``type``, queue ``queue``, ``max_retry``, the payload
    `compensation_payload` of the failed task's id, no parents, and is due at once.
    """

    type: str
    queue: str
    max_retry: int = 0

    def __post_init__(self) -> None:
        check_identifier(self.type, what="Compensation.type")
        check_identifier(self.queue, what="Compensation.queue")
        _count(self.max_retry, what="Compensation.max_retry", minimum=0)

    def task(self, failed_id: str, task_id: str) -> NewTask:
        """The compensation of ``failed_id``, stored under ``task_id``."""
        return NewTask(
            task_id, self.type, self.queue, compensation_payload(failed_id), max_retry=self.max_retry
        )


def check_compensations(compensations: object) -> dict[str, Compensation]:
    """`Broker.reap`'s ``compensations`` (failed task type -> `Compensation`) as a dict, or a
    `TypeError` naming what is wrong."""
    if compensations is None:
        return {}
    if not isinstance(compensations, Mapping):
        raise TypeError(
            f"compensations must be a mapping of task type to Compensation, got {compensations!r}"
        )
    for task_type, compensation in compensations.items():
        check_identifier(task_type, what="compensated task type")
        if not isinstance(compensation, Compensation):
            raise TypeError(
                f"compensations[{task_type!r}] must be a Compensation, got {type(compensation).__name__}"
            )
    return dict(compensations)


@dataclass(frozen=True, slots=True)
class Fail:
    """Count a failure by ``kind`` and fail the task for good (its descendants are canceled).

    ``traceback`` becomes the task's ``last_traceback``, as for `Retry`. ``compensation``: also
    submit that task in the same unit (`Compensation`); a stale token submits nothing.
    """

    task_id: str
    token: str
    kind: FailureKind
    error: str
    traceback: str | None = None
    compensation: Compensation | None = None

    def __post_init__(self) -> None:
        _lease_ref(self.task_id, self.token, "Fail")
        _failure(self.kind, self.error, "Fail")
        object.__setattr__(self, "error", storable_error(self.error))
        object.__setattr__(self, "traceback", _traceback(self.traceback, "Fail"))
        if self.compensation is not None and not isinstance(self.compensation, Compensation):
            raise TypeError(
                f"Fail.compensation must be a Compensation or None, got {type(self.compensation).__name__}"
            )


@dataclass(frozen=True, slots=True)
class Requeue:
    """Put a running task back to ``pending``, due now, touching no counter."""

    task_id: str
    token: str

    def __post_init__(self) -> None:
        _lease_ref(self.task_id, self.token, "Requeue")


@dataclass(frozen=True, slots=True)
class Canceled:
    """End a running task whose handler was stopped by a cancel (its descendants too)."""

    task_id: str
    token: str

    def __post_init__(self) -> None:
        _lease_ref(self.task_id, self.token, "Canceled")


Finish = Complete | Retry | Fail | Requeue | Canceled
_FINISH_TYPES = (Complete, Retry, Fail, Requeue, Canceled)


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Shared capacity taken for tasks that never ran: quota units and ``queue``'s slots.

    ``quota`` pairs each grant with the units to give back to ITS window (0 to ``granted``);
    ``slots`` are slot tokens of ``queue`` (a token not held is ignored).
    """

    quota: tuple[tuple[QuotaGrant, int], ...] = ()
    queue: str | None = None
    slots: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        pairs = _tuple_of(self.quota, tuple, what="GiveBack.quota")
        for pair in pairs:
            grant, n = pair if isinstance(pair, tuple) and len(pair) == 2 else (pair, 0)
            if not isinstance(grant, QuotaGrant):
                raise TypeError(f"GiveBack.quota pairs a QuotaGrant with units, got {pair!r}")
            if _count(n, what="GiveBack.quota units", minimum=0) > grant.granted:
                raise ValueError(f"cannot give back {n} units of a grant of {grant.granted}")
        object.__setattr__(self, "quota", pairs)
        object.__setattr__(self, "slots", _tuple_of(self.slots, str, what="GiveBack.slots"))
        if self.slots and self.queue is None:
            raise ValueError("GiveBack.slots needs the queue they belong to")
        if self.queue is not None:
            check_identifier(self.queue, what="GiveBack.queue")


@dataclass(frozen=True, slots=True)
class Settle:
    """End the runs of ``items`` (and give back ``give_back``) in ONE call; see `Broker.settle`.

    ``snapshots=False``: an item that took effect is answered None instead of its snapshot.
    """

    items: tuple[Finish, ...] = ()
    snapshots: bool = True
    give_back: GiveBack | None = None

    def __post_init__(self) -> None:
        items = self.items
        if type(items) is not tuple or any(type(i) not in _FINISH_TYPES for i in items):
            if isinstance(items, _FINISH_TYPES):
                raise TypeError("Settle.items takes a sequence of items, not a single one")
            object.__setattr__(self, "items", _tuple_of(items, _FINISH_TYPES, what="Settle.items"))
        if self.give_back is not None and not isinstance(self.give_back, GiveBack):
            raise TypeError(f"Settle.give_back must be a GiveBack, got {type(self.give_back).__name__}")


# -- heartbeat ---------------------------------------------------------------------------


# The largest progress value stored, in bytes of its JSON text.
MAX_PROGRESS_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Extend one lease to ``now + lease_ttl``; see `Broker.heartbeat`.

    ``slot_queue``: the lease also holds a shared slot of that queue under its token, renewed
    with it. ``progress``: also store this JSON text as the task's ``progress_json`` (at most
    `MAX_PROGRESS_BYTES` in UTF-8; None: leave it), under the same token check.
    """

    task_id: str
    token: str
    lease_ttl: timedelta
    slot_queue: str | None = None
    progress: str | None = None

    def __post_init__(self) -> None:
        _lease_ref(self.task_id, self.token, "Heartbeat")
        _duration(self.lease_ttl, what="lease_ttl", positive=True)
        if self.slot_queue is not None:
            check_identifier(self.slot_queue, what="slot queue")
        if self.progress is not None:
            check_progress(self.progress)


def check_progress(text: object) -> str:
    """``text`` if it is a storable progress value (a str of at most `MAX_PROGRESS_BYTES` in
    UTF-8, without NUL), else `TypeError`/`ValueError` saying why."""
    if not isinstance(text, str):
        raise TypeError(f"Heartbeat.progress must be a str of JSON or None, got {type(text).__name__}")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_PROGRESS_BYTES:
        raise ValueError(f"progress is {size} bytes of JSON; at most {MAX_PROGRESS_BYTES} allowed")
    if "\x00" in text or (not text.isascii() and _unencodable(text)):
        raise ValueError("progress must be UTF-8 text without NUL characters")
    return text


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@dataclass(frozen=True, slots=True)
class Renewal:
    """The answer to a heartbeat: the new lease end, whether a cancel was requested, and
    whether the lease's shared slot was no longer held (its handler must stop)."""

    expires_at: datetime
    cancel_requested: bool
    slot_lost: bool = False
