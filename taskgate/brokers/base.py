"""The broker protocol: the repository every backend implements.

A broker stores tasks and moves them between states; each method is ONE atomic state
transition (one lock hold, one transaction, one Lua script). Brokers hold no policy: no
limits, no retry decisions, no logging of business events -- `Gate` decides, the broker obeys.

Why synchronous: the runtime must serve asyncio apps (FastAPI) and Trio apps alike, and
SQLAlchemy's asyncio extension and redis-py's asyncio client only run on asyncio. `Gate` calls
each method through ``anyio.to_thread.run_sync``; the thread hop (100-200 µs) is below a
database round trip, and batching (claim k tasks at once) amortises it. Brokers whose calls
are cheaper than the hop say so in their `Capabilities` and are called on the event loop
(memory), or first attempted there and moved to a thread only when they would wait
(SQLite: `taskgate.brokers.nowait`), or send their request from the event loop and have it
wait for the reply's socket (Redis: `taskgate.brokers.split`). A blocking client for sync
code (Flask, Django, cron, scripts) falls out for free.

Time: every time-dependent method reads "now" from the broker's clock: an injected `Clock`
when one was given (the contract suite moves a `ManualClock` instead of sleeping), otherwise
the storage medium's own clock where it has one (database server, Redis ``TIME``).

Writes by a worker carry the lease token it got from `claim`; a stale token raises
`LeaseLostError` and changes nothing, so a late or duplicate write never overwrites a newer state.

Settled on its own: a transition that makes a task final also settles that task's blocked
descendants in the same unit (a child woken to ``pending``, descendants canceled by the
cascade). Each method answers with the task it names; the others reach the one sink set with
`Broker.report_settled` -- one option for every transition, so no verb grows a second answer
for it, and a broker without a sink builds none of those snapshots.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from taskgate.ids import MAX_ID_LENGTH
from taskgate.task import Filter, Status, Task

if TYPE_CHECKING:
    from taskgate.brokers.params import (
        Claim,
        Claimed,
        Compensation,
        Heartbeat,
        Hold,
        ItemAnswer,
        Prune,
        QueueQuery,
        QueueState,
        Renewal,
        Replay,
        Settle,
        Step,
        Submit,
        Submitted,
    )

__all__ = [
    "MAX_DELAY",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "UNSET",
    "Broker",
    "Capabilities",
    "FailureKind",
    "Lease",
    "NewTask",
    "QuotaGrant",
    "QuotaSpec",
    "SettledSink",
    "Unset",
    "check_identifier",
    "check_priority",
]


# A delay is added to the broker's clock; beyond this it would overflow datetime arithmetic.
MAX_DELAY = timedelta(days=36_500)


class Unset(Enum):
    """Marker type for "argument not given" where ``None`` is a meaningful value."""

    UNSET = "UNSET"


UNSET = Unset.UNSET

# Receives the snapshots of the tasks one call settled on its own (`Broker.report_settled`).
SettledSink = Callable[[builtins.list[Task]], None]


class FailureKind(StrEnum):
    """Which counter a failed run moves.

    BUSINESS and SKIP add one to ``attempts`` (the handler ran and failed); THROTTLED adds one
    to ``throttled`` and leaves ``attempts`` alone (the gateway was busy, nothing was tried).
    """

    BUSINESS = "business"
    THROTTLED = "throttled"
    SKIP = "skip"


def is_identifier(value: object) -> bool:
    """Whether ``value`` passes `check_identifier` (not empty): for hot paths, which then call
    `check_identifier` only to raise, and build its message only for a value that fails."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH and "\x00" not in value


def check_identifier(value: object, *, what: str, allow_empty: bool = False) -> str:
    """Return ``value`` if it is a usable id/type/queue/key string, else raise naming ``what``.

    Strings are limited to 255 characters so that every backend (MySQL's indexed VARCHAR)
    can store them.
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}: {value!r}")
    if not value and not allow_empty:
        raise ValueError(f"{what} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{what} is {len(value)} characters long; at most {MAX_ID_LENGTH} allowed")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters: {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class NewTask:
    """One task to enqueue, validated on construction.

    ``run_at`` (absolute) wins over ``delay`` (relative to the broker's clock); with neither
    the task is due at once. ``depends_on`` names parents that must exist already or appear
    earlier in the same `Broker.submit`. ``timeout`` is the task's own run-time limit (None:
    its queue's applies), stored with it in whole milliseconds -- a finer one is rounded up,
    so every backend gives back the same value. ``group`` puts the task in a group of its
    queue (a tenant, a user), whose own limits a claim may apply (`SharedLimits`).
    ``trace_context``: the submitter's tracing context (text, at most `MAX_TRACE_CONTEXT`
    characters), stored as it is and given back as ``Task.trace_context``. ``priority``
    (-2**31 to 2**31-1): among the due tasks of its queue, a higher one is claimed first.
    """

    id: str
    type: str
    queue: str
    payload: bytes | None = None
    max_retry: int = 0
    run_at: datetime | None = None
    delay: timedelta | None = None
    depends_on: tuple[str, ...] = ()
    ignore_parent_failure: bool = False
    business_key: str | None = None
    timeout: timedelta | None = None
    group: str | None = None
    trace_context: str | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        check_identifier(self.id, what="task id")
        check_identifier(self.type, what="task type")
        check_identifier(self.queue, what="queue")
        if self.business_key is not None:
            check_identifier(self.business_key, what="business_key")
        if self.group is not None:
            check_identifier(self.group, what="group")
        if self.payload is not None and not isinstance(self.payload, bytes):
            raise TypeError(f"payload must be bytes or None, got {type(self.payload).__name__}")
        if isinstance(self.max_retry, bool) or not isinstance(self.max_retry, int):
            raise TypeError(f"max_retry must be an int, got {self.max_retry!r}")
        if self.max_retry < 0:
            raise ValueError(f"max_retry must be >= 0, got {self.max_retry}")
        if self.run_at is not None and (not isinstance(self.run_at, datetime) or self.run_at.tzinfo is None):
            raise ValueError(f"run_at must be a timezone-aware datetime, got {self.run_at!r}")
        if self.delay is not None and (
            not isinstance(self.delay, timedelta) or not timedelta(0) <= self.delay <= MAX_DELAY
        ):
            raise ValueError(f"delay must be a timedelta from 0 to {MAX_DELAY.days} days, got {self.delay!r}")
        if isinstance(self.depends_on, str):
            raise TypeError("depends_on must be a sequence of ids, not a single str")
        object.__setattr__(self, "depends_on", tuple(self.depends_on))
        for parent in self.depends_on:
            check_identifier(parent, what="depends_on id")
        if self.id in self.depends_on:
            raise ValueError(f"task {self.id} cannot depend on itself")
        if self.timeout is not None:
            object.__setattr__(self, "timeout", _checked_timeout(self.timeout))
        if self.trace_context is not None:
            _check_trace_context(self.trace_context)
        check_priority(self.priority)


_MILLISECOND = timedelta(milliseconds=1)

# A priority fits a 32-bit signed integer: an INTEGER column on every database.
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1


def check_priority(value: object) -> int:
    """Return ``value`` if it is a usable priority (an int, not a bool, within 32 bits), else
    raise `TypeError`/`ValueError` naming ``priority``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"priority must be an int, got {type(value).__name__}: {value!r}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"priority must be from {MIN_PRIORITY} to {MAX_PRIORITY}, got {value}")
    return value


MAX_TRACE_CONTEXT = 4096  # characters: a traceparent is 55, a tracestate at most 512 more


def _check_trace_context(text: object) -> None:
    """Raise naming ``NewTask.trace_context`` unless ``text`` is a short str without NUL."""
    if not isinstance(text, str):
        raise TypeError(f"trace_context must be a str or None, got {type(text).__name__}")
    if len(text) > MAX_TRACE_CONTEXT or "\x00" in text:
        raise ValueError(f"trace_context must be at most {MAX_TRACE_CONTEXT} characters without NUL")


def _checked_timeout(timeout: object) -> timedelta:
    """``NewTask.timeout`` in whole milliseconds (rounded up), or raise naming the field."""
    if not isinstance(timeout, timedelta):
        raise TypeError(f"timeout must be a timedelta or None, got {type(timeout).__name__}: {timeout!r}")
    if not timedelta(0) < timeout <= MAX_DELAY:
        raise ValueError(
            f"timeout must be a timedelta above 0 and at most {MAX_DELAY.days} days, got {timeout!r}"
        )
    return -(-timeout // _MILLISECOND) * _MILLISECOND


@dataclass(frozen=True, slots=True)
class Lease:
    """A claimed task: the snapshot after the claim, the lease token and when the lease ends."""

    task: Task
    token: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class QuotaGrant:
    """Units taken from one quota window; ``granted`` may be fewer than asked, even 0.

    ``window_start``/``window_end`` are on the medium's clock, aligned to the Unix epoch.
    Releasing passes the grant back so units go to the window they came from.
    """

    key: str
    window_start: datetime
    window_end: datetime
    granted: int
    limit: int


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """A quota budget: ``limit`` units per epoch-aligned ``period`` of ``key``."""

    key: str
    limit: int
    period: timedelta

    def __post_init__(self) -> None:
        check_identifier(self.key, what="quota key")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise TypeError(f"quota limit must be an int, got {self.limit!r}")
        if self.limit < 1:
            raise ValueError(f"quota limit must be >= 1, got {self.limit}")
        if not isinstance(self.period, timedelta):
            raise TypeError(f"quota period must be a timedelta, got {self.period!r}")
        if self.period <= timedelta(0):
            raise ValueError(f"quota period must be > 0, got {self.period!r}")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a broker honours beyond the base protocol, and how `Gate` may call it. Declared,
    never sniffed.

    What it honours:

    - ``shared_quota``: quota windows (`Claim.quota`) are counted in a medium all processes of
      this broker see (process memory counts for the memory broker: all its users are in one
      process). `Gate` refuses a quota on a broker without it.
    - ``shared_limits``: `Claim.shared` is honoured -- the queue's workers and rate counted
      across every process. A broker without it refuses a `Claim` carrying ``shared`` with a
      `ValueError` naming the field, and `Gate` counts the limits in each process.
    - ``group_limits``: the group limits of `SharedLimits` (``group_workers`` and the like) are
      honoured. A broker without it refuses a `Claim` setting them with a `ValueError` naming
      the field, and `Gate` refuses a queue configured with them.
    - ``cross_process``: several processes can share the tasks.
    - ``push_wakeups``: `Broker.wait_for_work` is woken by other processes' submits, not polled.
    - ``in_app_transaction``: implements `taskgate.brokers.outbox.InTransaction`, so
      `Gate.enqueue_in` can write tasks in an application's own SQLAlchemy transaction.

    How it is best called (every broker answers every call correctly either way):

    - ``nonblocking``: every method but `Broker.wait_for_work` returns within microseconds and
      does no I/O, so `Gate` may call it on the event loop instead of hopping to a thread.
    - ``inline_attempts``: a method is usually short local work, so `Gate` first calls it on
      the event loop inside `taskgate.brokers.nowait.no_wait`; where it would have to wait it
      raises `taskgate.brokers.nowait.WouldBlock` having changed nothing, and `Gate` runs it
      again in a thread (SQLite).
    - ``acks_in_claims``: acks carried by a `Claim` cost less than writing them apart, so `Gate`
      lets the acks waiting to be written ride on the next claim of their queue (a broker with
      one writer at a time, where the two could not overlap anyway).
    - ``split_calls``: implements `taskgate.brokers.split.SplitCaller`, so `Gate` sends the
      requests of the calls it splits from the event loop and waits for their replies there,
      with no thread hop (Redis).
    """

    shared_quota: bool = False
    shared_limits: bool = False
    group_limits: bool = False
    cross_process: bool = False
    push_wakeups: bool = False
    in_app_transaction: bool = False
    extra: frozenset[str] = field(default_factory=frozenset)
    nonblocking: bool = False
    inline_attempts: bool = False
    acks_in_claims: bool = False
    split_calls: bool = False


@runtime_checkable
class Broker(Protocol):
    """The repository protocol: one method per verb, each one atomic transition taking one
    checked parameter object (`taskgate.brokers.params`); see the module docstring.

    Missing tasks raise `TaskNotFoundError`; stale lease tokens raise `LeaseLostError` (or
    answer it, per item, where a call takes several); medium failures raise `BrokerError`.
    No method leaves a partial change behind.
    """

    capabilities: Capabilities

    def submit(self, submit: Submit) -> Submitted:
        """Store ``submit.tasks`` all-or-nothing; their statuses (and snapshots) in order.

        Status on arrival: ``pending`` without parents; with parents, ``pending`` when every
        parent is completed (or final, for ``ignore_parent_failure``), ``canceled`` when a
        parent failed or was canceled (unless ``ignore_parent_failure``), else ``blocked``.
        Parents must exist already or come earlier in the same submit. A used business key
        raises `TaskExistsError` with the key's newest execution (exactly one of many racing
        submitters wins); an unknown parent raises `TaskNotFoundError`. No tasks: no change.
        With ``submit.max_pending``, a batch that would take a limited queue's pending +
        retrying + blocked tasks past its limit raises `QueueFullError`, counted in the same
        unit as the insert (of many racing submitters, never more pass than there is room).
        """
        ...

    def replay(self, replay: Replay) -> Task:
        """Create execution ``new_id`` re-running ``execution_id``, atomically with the checks.

        The new execution copies type, queue, max_retry, timeout, business key, parents and
        (unless given) payload, has ``replay_of=execution_id`` and fresh counters; its status follows
        the `submit` rule. The old record never changes. Raises `ReplayNotFinalError`,
        `AlreadyReplayedError` (not the newest of its chain) or `CompletedNotAllowedError`; a
        ``new_id`` in use raises `ValueError`.
        """
        ...

    def get(self, task_id: str) -> Task:
        """The current snapshot of ``task_id``; `TaskNotFoundError` when there is none."""
        ...

    def list(self, filter: Filter) -> builtins.list[Task]:
        """Tasks matching ``filter``, sorted by ``(created_at, id)``, then offset, then limit.

        ``Filter(business_key=k)`` gives every execution of ``k``, oldest first.
        """
        ...

    def counts(self) -> dict[str, dict[Status, int]]:
        """Task counts by type and status, from counters or an index -- never a payload scan.

        Types and statuses with no task may be absent.
        """
        ...

    def queue_state(self, query: QueueQuery) -> QueueState:
        """How many tasks of ``query.queue`` are pending or retrying (due or not), its hold
        (``held_until``, when held), with ``query.quota`` the figures of that budget's current
        window, and with ``query.unhandled`` how many of those tasks it names -- read only, one
        read.

        The window is the epoch-aligned one holding ``now`` (the medium's clock): one nothing
        was taken from yet answers ``used`` 0, one older than the newest kept (the clock
        stepped back) answers ``used == limit``, as a claim would find it; ``used`` never
        exceeds ``query.quota.limit``. Running, blocked and final tasks are not counted.
        """
        ...

    def hold(self, hold: Hold) -> datetime | None:
        """Hold ``hold.queue`` until ``now + hold.for_`` (None: until resumed), keeping a longer
        hold already set, or with ``hold.resume`` end its hold; answer the queue's hold after
        the call (`HELD_INDEFINITELY` until resumed; None: not held).

        While a queue is held no claim leases its tasks (`Claimed.held_until`); running tasks
        are not touched. A queue needs no task to be held.
        """
        ...

    def claim(self, claim: Claim) -> Claimed:
        """Write ``claim.acks`` (as `settle` would, quietly), then lease up to ``claim.limit``
        due tasks of ``claim.queue`` (pending/retrying, ``run_at <= now``) -- one call.

        With ``types``, only tasks of those types are leased, in claim order among them
        however many due tasks of other types come before (they stay as they are); None leases
        any type. Claim order: highest ``priority`` first, then oldest due (``run_at``), then
        id -- a not-yet-due task waits however high its priority. Each becomes ``running``
        with ``claims += 1``, ``started_at = now`` and a fresh token valid until
        ``now + lease_ttl``. A task is returned to at most one claimer while its lease is valid;
        never more than ``limit``.
        With ``quota``, each task claimed takes one unit of the window (fewer tasks when fewer
        units are left, none and ``exhausted`` when none are); with ``shared``, one shared slot
        (under the lease's token, expiring with the lease) and one start of the rate. Units,
        slots and starts are spent only for tasks claimed, so a failed call spends nothing.
        The claim sees what the acks wrote: a child they made ready may be leased by it.
        A held queue (`hold`, ``Retry.hold_queue``) leases nothing and answers ``held_until``.
        """
        ...

    def settle(self, settle: Settle) -> builtins.list[ItemAnswer]:
        """End the runs of ``settle.items`` in ONE unit, then give back ``settle.give_back``;
        one answer per item, in order.

        `Complete` completes the task and wakes children now ready; `Retry` counts the failure
        by kind and sets ``retrying`` due at ``now + delay``; `Fail` counts it, sets ``failed``
        and cancels descendants (and submits its ``compensation``, if any, in the same unit);
        `Requeue` puts the task back to ``pending`` due now, touching no counter; `Canceled`
        ends a run stopped by a cancel (with cascade). A `Retry` or `Requeue` of a task whose
        cancel was requested cancels it instead (with cascade). Items are independent: an
        unknown id or a stale token answers its own item with `TaskNotFoundError`/
        `LeaseLostError` and changes nothing for it; a `Retry` with ``hold_queue`` whose token
        holds the task also holds its queue until ``now + delay``; a lease named twice is
        settled once (the later item answers `LeaseLostError`). A value the medium cannot
        store raises for the whole call, before anything is written. Given-back quota units go
        to the window they came from (never below 0); slots not held are ignored.
        """
        ...

    def heartbeat(self, heartbeat: Heartbeat) -> Renewal:
        """Extend the lease to ``now + lease_ttl`` (and its shared slot, for ``slot_queue``)
        and report whether a cancel was requested and whether the slot was lost."""
        ...

    def cancel(self, task_id: str) -> Task:
        """Cancel a task.

        blocked/pending/retrying: ``canceled`` at once, with its descendants (cascade).
        running: only marked; the holder sees the mark on its next heartbeat and stops.
        Final: raises `AlreadyFinalError`.
        """
        ...

    def prune(self, prune: Prune) -> int:
        """Delete up to ``prune.limit`` final tasks in ``prune.statuses`` that finished at or
        before ``now - prune.older_than`` (and match its queues, type and group), oldest
        created first; answer how many were deleted. One call is one bounded unit and may leave
        matching tasks for the next (an execution it left newest of its chain; on Redis those
        past the index entries it looks at): a caller wanting all gone calls until one
        deletes nothing.

        Kept whatever their age: a task with a child that is not final (its parent stays until
        the child is final too) and a task replayed by an execution still stored (the newest of
        a replay chain goes first; the one it replayed is then the newest). Each deleted task
        goes with its dependency edges (as a child, and as the parent of final children, whose
        ``depends_on`` still names it), its durable steps (`step`) and its index entries; a
        business key whose last execution goes is free again, one whose newest goes names the
        execution it replayed.
        Never blocks on a task another call holds: such a task is left for a later prune.
        """
        ...

    def step(self, step: Step) -> bytes | None:
        """Read the stored result of step ``step.name`` of task ``step.task_id`` (None: none
        stored), or with ``step.result`` store it unless one is stored already; answer the
        result stored after the call -- the first writer's, so racing runs agree on one.

        No lease token is asked: a run whose lease was lost may have paid for the step's work
        already, and what it got is still worth keeping. Steps belong to one execution: a
        replay starts without any, and `prune` deletes a task's steps with it. An unknown task
        raises `TaskNotFoundError`, storing nothing.
        """
        ...

    def reap(
        self,
        *,
        lease_lost_max: int,
        limit: int = 1000,
        compensations: Mapping[str, Compensation] | None = None,
    ) -> builtins.list[Task]:
        """Take back up to ``limit`` running tasks whose lease ended; return their new snapshots.

        Each gets ``lease_lost += 1`` and goes back to ``pending``; at ``lease_lost_max`` it
        fails instead (with cascade) and, when ``compensations`` names its type, that
        `Compensation` is submitted in the same unit; a task marked for cancel is canceled.
        Two reapers at once count a lease once.
        """
        ...

    def report_settled(self, sink: SettledSink | None) -> None:
        """From now on, give ``sink`` the snapshots of the tasks each call settles on its own;
        None stops it. `Gate` sets one when an ``on_state_change`` hook is configured.

        Settled on its own: a blocked child woken to ``pending``, or a descendant canceled by
        the cascade, by any transition that makes a task final -- `settle`, the acks a `claim`
        carries, `cancel` and `reap`. The task a call names is still its own answer, never the
        sink's. The sink gets the rest, as they were right after the call, in the order they
        were settled: once per call that settled any (never an empty list), after the call's
        unit committed and every lock it took was released, in the thread that made the call
        (the event loop, for a call made or split there). A call that wrote nothing reports
        nothing. ``sink`` must not raise or block: the unit is written already.

        Without a sink no such snapshot is read or built, so the transitions cost what they
        did. A broker has one sink: setting one replaces the one before.
        """
        ...

    def wait_for_work(self, queues: Collection[str], timeout: float) -> bool:
        """Block up to ``timeout`` seconds until work may be due in ``queues``.

        Returns True when woken by a submit/requeue/wake-up (spurious True is allowed),
        False on timeout; with ``timeout=0``, whether a task of ``queues`` is due now -- of
        any type: a due task no claim of the caller takes (`Claim.types`) answers True too,
        so a caller that finds nothing to claim waits its poll interval before asking again.
        `close` wakes every waiter.
        """
        ...

    def close(self) -> None:
        """Release connections and wake waiters. Idempotent."""
        ...
