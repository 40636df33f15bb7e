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
`Broker.report_settled` -- one option for every transition, so no method grows a parameter
or a second answer for it, and a broker without a sink builds none of those snapshots.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum, StrEnum
from typing import Protocol, runtime_checkable

from taskgate.errors import LeaseLostError, TaskNotFoundError
from taskgate.ids import MAX_ID_LENGTH
from taskgate.task import Filter, Status, Task

__all__ = [
    "MAX_DELAY",
    "UNSET",
    "AckCarrier",
    "AckItem",
    "AckOutcome",
    "Broker",
    "Capabilities",
    "DistributedLimiter",
    "FailureKind",
    "Lease",
    "LimitedAckCarrier",
    "LimitedClaim",
    "NewTask",
    "QuietAckOutcome",
    "QuietAcker",
    "QuietEnqueuer",
    "QuotaClaim",
    "QuotaGrant",
    "QuotaSpec",
    "Renewal",
    "SettledSink",
    "Unset",
    "check_identifier",
]


# A delay is added to the broker's clock; beyond this it would overflow datetime arithmetic.
MAX_DELAY = timedelta(days=36_500)


class Unset(Enum):
    """Marker type for "argument not given" where ``None`` is a meaningful value."""

    UNSET = "UNSET"


UNSET = Unset.UNSET

# Receives the snapshots of the tasks one call settled on its own (`Broker.report_settled`).
SettledSink = Callable[[builtins.list[Task]], None]

# One `Broker.ack_many` item, ``(task_id, token, result)``, and its answer: the completed
# snapshot, or the error `Broker.ack` would have raised for that item alone.
AckItem = tuple[str, str, bytes | None]
AckOutcome = Task | LeaseLostError | TaskNotFoundError
# The answer of `QuietAcker.ack_many_quiet` for one item: None when it completed the task.
QuietAckOutcome = LeaseLostError | TaskNotFoundError | None


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
    earlier in the same `Broker.enqueue` batch.
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

    def __post_init__(self) -> None:
        check_identifier(self.id, what="task id")
        check_identifier(self.type, what="task type")
        check_identifier(self.queue, what="queue")
        if self.business_key is not None:
            check_identifier(self.business_key, what="business_key")
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


@dataclass(frozen=True, slots=True)
class Lease:
    """A claimed task: the snapshot after the claim, the lease token and when the lease ends."""

    task: Task
    token: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Renewal:
    """The answer to a heartbeat: the new lease end, and whether a cancel was requested."""

    expires_at: datetime
    cancel_requested: bool


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
class QuotaClaim:
    """What `Broker.claim_within_quota` did.

    ``grant`` holds exactly the units the claimed tasks took (``granted == len(leases)``);
    ``exhausted`` is True when the window had no unit left at all (wait for ``window_end``).
    """

    leases: list[Lease]
    grant: QuotaGrant
    exhausted: bool


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """A quota budget: ``limit`` units per epoch-aligned ``period`` of ``key``."""

    key: str
    limit: int
    period: timedelta


@dataclass(frozen=True, slots=True)
class LimitedClaim:
    """What `DistributedLimiter.claim_with_limits` did.

    ``retry_after`` > 0: the rate held due tasks back; the next start may be allowed after
    that many seconds. ``quota``: what the quota window gave, when one was asked for.
    """

    leases: list[Lease]
    retry_after: float = 0.0
    quota: QuotaClaim | None = None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a broker can do beyond the base protocol. Declared, never sniffed.

    - ``shared_quota``: quota windows are counted in a medium all processes of this broker see
      (process memory counts for the memory broker: all its users are in one process).
    - ``cross_process``: several processes can share the tasks.
    - ``distributed_limits``: implements `DistributedLimiter` (global workers and rps).
    - ``push_wakeups``: `Broker.wait_for_work` is woken by other processes' submits, not polled.
    - ``nonblocking``: every method but `Broker.wait_for_work` returns within microseconds and
      does no I/O, so `Gate` may call it on the event loop instead of hopping to a thread.
    - ``inline_attempts``: a method is usually short local work, so `Gate` first calls it on
      the event loop inside `taskgate.brokers.nowait.no_wait`; where it would have to wait it
      raises `taskgate.brokers.nowait.WouldBlock` having changed nothing, and `Gate` runs it
      again in a thread (SQLite).
    - ``quiet_acks``: implements `QuietAcker`, so `Gate` completes tasks without reading
      back their snapshots when nothing would look at them (no ``on_state_change`` hook).
    - ``quiet_enqueue``: implements `QuietEnqueuer`, so `Gate` stores submitted tasks without
      building their snapshots when nothing would look at them (no ``on_state_change`` hook).
    - ``acks_in_claims``: implements `AckCarrier` (and `LimitedAckCarrier` when it declares
      ``distributed_limits`` too), so the quiet acks waiting to be written ride on the next
      claim of their queue: one broker call where an ack write and a claim take two.
    - ``split_calls``: implements `taskgate.brokers.split.SplitCaller`, so `Gate` sends the
      requests of the methods it splits from the event loop and waits for their replies there,
      with no thread hop (Redis).
    """

    shared_quota: bool = False
    cross_process: bool = False
    distributed_limits: bool = False
    push_wakeups: bool = False
    extra: frozenset[str] = field(default_factory=frozenset)
    nonblocking: bool = False
    inline_attempts: bool = False
    quiet_acks: bool = False
    quiet_enqueue: bool = False
    acks_in_claims: bool = False
    split_calls: bool = False


@runtime_checkable
class Broker(Protocol):
    """The repository protocol. Every method is one atomic transition; see the module docstring.

    Missing tasks raise `TaskNotFoundError`; stale lease tokens raise `LeaseLostError`;
    medium failures raise `BrokerError`. No method leaves a partial change behind.
    """

    capabilities: Capabilities

    # -- tasks: create ---------------------------------------------------------------------

    def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        """Store ``tasks`` all-or-nothing and return their snapshots in the same order.

        Status on arrival: ``pending`` without parents; with parents, ``pending`` when every
        parent is completed (or final, for ``ignore_parent_failure``), ``canceled`` when a
        parent failed or was canceled (unless ``ignore_parent_failure``), else ``blocked``.
        A used business key raises `TaskExistsError` with the key's newest execution (exactly
        one of many racing submitters wins); an unknown parent raises `TaskNotFoundError`.
        """
        ...

    def replay(
        self,
        execution_id: str,
        *,
        new_id: str,
        allow_completed: bool = False,
        payload: bytes | Unset | None = UNSET,
    ) -> Task:
        """Create execution ``new_id`` re-running ``execution_id``, atomically with the checks.

        The new execution copies type, queue, max_retry, business key, parents and (unless
        given) payload, has ``replay_of=execution_id`` and fresh counters; its status follows
        the `enqueue` rule. The old record never changes. Raises `ReplayNotFinalError`,
        `AlreadyReplayedError` (not the newest of its chain) or `CompletedNotAllowedError`.
        """
        ...

    # -- tasks: read -----------------------------------------------------------------------

    def get(self, task_id: str) -> Task:
        """The current snapshot of ``task_id``."""
        ...

    def list(self, filter: Filter) -> list[Task]:
        """Tasks matching ``filter``, sorted by ``(created_at, id)``, then offset, then limit."""
        ...

    def history(self, business_key: str) -> builtins.list[Task]:
        """Every execution of ``business_key``, oldest first; ``[]`` for an unknown key."""
        ...

    def counts(self) -> dict[str, dict[Status, int]]:
        """Task counts by type and status, from counters or an index -- never a payload scan.

        Types and statuses with no task may be absent.
        """
        ...

    def queue_length(self, queue: str) -> int:
        """How many tasks of ``queue`` are pending or retrying (due or not)."""
        ...

    # -- tasks: the worker's transitions ---------------------------------------------------

    def claim(self, queue: str, limit: int, lease_ttl: timedelta) -> builtins.list[Lease]:
        """Lease up to ``limit`` due tasks of ``queue`` (pending/retrying, ``run_at <= now``).

        Oldest due first (``run_at``, then id). Each becomes ``running`` with ``claims += 1``,
        ``started_at = now`` and a fresh token valid until ``now + lease_ttl``. A task is
        returned to at most one claimer while its lease is valid. Never more than ``limit``.
        """
        ...

    def claim_within_quota(
        self, queue: str, limit: int, lease_ttl: timedelta, *, key: str, quota_limit: int, period: timedelta
    ) -> QuotaClaim:
        """`claim` and `reserve_quota` as ONE atomic step: one unit of ``key``'s current window
        per task claimed, up to ``limit`` tasks and the units left.

        Units are taken only for tasks claimed, so nothing is given back afterwards and a
        failed call spends nothing. Raises `BrokerError` when the medium cannot be reached.
        """
        ...

    def heartbeat(self, task_id: str, token: str, lease_ttl: timedelta) -> Renewal:
        """Extend the lease to ``now + lease_ttl`` and report whether a cancel was requested."""
        ...

    def ack(self, task_id: str, token: str, result: bytes | None) -> Task:
        """Complete the task with ``result`` and, in the same unit, wake children now ready."""
        ...

    def ack_many(self, items: Sequence[AckItem]) -> builtins.list[AckOutcome]:
        """`ack` every ``(task_id, token, result)`` in ONE unit; one answer per item, in order.

        Items are independent, not all-or-nothing: an unknown id or a stale token answers its
        own item with the `TaskNotFoundError`/`LeaseLostError` that `ack` would raise and
        changes nothing for it, while every other item completes and wakes its children
        exactly as `ack` would. An id given twice is acked at most once (a later item answers
        `LeaseLostError`). Bad arguments raise before anything changes; ``[]`` gives ``[]``.
        """
        ...

    def retry(self, task_id: str, token: str, *, kind: FailureKind, error: str, delay: timedelta) -> Task:
        """Count the failure by ``kind`` and set ``retrying`` due at ``now + delay``.

        If a cancel was requested meanwhile, the task is canceled (with cascade) instead.
        """
        ...

    def fail(self, task_id: str, token: str, *, kind: FailureKind, error: str) -> Task:
        """Count the failure by ``kind``, set ``failed``, cancel descendants (cascade)."""
        ...

    def requeue(self, task_id: str, token: str) -> Task:
        """Put a running task back to ``pending``, due now, touching no counter.

        Used on graceful shutdown. If a cancel was requested meanwhile, cancels instead.
        """
        ...

    def finish_canceled(self, task_id: str, token: str) -> Task:
        """End a running task whose handler was stopped by a cancel: ``canceled`` + cascade."""
        ...

    # -- tasks: anyone's transitions -------------------------------------------------------

    def cancel(self, task_id: str) -> Task:
        """Cancel a task.

        blocked/pending/retrying: ``canceled`` at once, with its descendants (cascade).
        running: only marked; the holder sees the mark on its next heartbeat and stops.
        Final: raises `AlreadyFinalError`.
        """
        ...

    def reap(self, *, lease_lost_max: int, limit: int = 1000) -> builtins.list[Task]:
        """Take back up to ``limit`` running tasks whose lease ended; return their new snapshots.

        Each gets ``lease_lost += 1`` and goes back to ``pending``; at ``lease_lost_max`` it
        fails instead (with cascade); a task marked for cancel is canceled. Two reapers at once
        count a lease once.
        """
        ...

    # -- quota -----------------------------------------------------------------------------

    def reserve_quota(self, key: str, limit: int, period: timedelta, n: int = 1) -> QuotaGrant:
        """Take up to ``n`` units of the current window of ``key`` (epoch-aligned ``period``).

        Check and take are one atomic unit: across every process the window never grants
        more than ``limit``. Raises `BrokerError` when the medium cannot be reached.
        """
        ...

    def release_quota(self, grant: QuotaGrant, n: int) -> None:
        """Give back ``n`` units of ``grant`` to the window they came from (never below 0)."""
        ...

    # -- what transitions settle on their own -----------------------------------------------

    def report_settled(self, sink: SettledSink | None) -> None:
        """From now on, give ``sink`` the snapshots of the tasks each call settles on its own;
        None stops it. `Gate` sets one when an ``on_state_change`` hook is configured.

        Settled on its own: a blocked child woken to ``pending``, or a descendant canceled by
        the cascade, by any transition that makes a task final -- `ack`, `ack_many` and its
        quiet and claim-carrying forms, `fail`, `retry` and `requeue` when they cancel,
        `finish_canceled`, `cancel` and `reap`. The task a call names is still its own answer,
        never the sink's. The sink gets the rest, as they were right after the call, in the
        order they were settled: once per call that settled any (never an empty list), after
        the call's unit committed and every lock it took was released, in the thread that
        made the call (the event loop, for a call made or split there). A call that wrote
        nothing reports nothing. ``sink`` must not raise or block: the unit is written already.

        Without a sink no such snapshot is read or built, so the transitions cost what they
        did. A broker has one sink: setting one replaces the one before.
        """
        ...

    # -- wake-ups and lifecycle -------------------------------------------------------------

    def wait_for_work(self, queues: Collection[str], timeout: float) -> bool:
        """Block up to ``timeout`` seconds until work may be due in ``queues``.

        Returns True when woken by an enqueue/requeue/wake-up (spurious True is allowed),
        False on timeout. `close` wakes every waiter.
        """
        ...

    def close(self) -> None:
        """Release connections and wake waiters. Idempotent."""
        ...


@runtime_checkable
class QuietAcker(Protocol):
    """`Broker.ack_many` without the snapshots, for callers that do not look at them.

    Only brokers declaring ``capabilities.quiet_acks`` implement it.
    """

    def ack_many_quiet(self, items: Sequence[AckItem]) -> builtins.list[QuietAckOutcome]:
        """`Broker.ack_many` of ``items``, exactly -- the same unit, the same writes, the same
        errors for the same items, the same children woken -- except that an item it completed
        is answered None instead of its task's snapshot.

        Reading a whole task back (payload and result included) is most of what an ack costs
        where rows are parsed in Python or replies carry every field; the runtime's group acks
        only need to know which tasks completed.
        """
        ...


@runtime_checkable
class QuietEnqueuer(Protocol):
    """`Broker.enqueue` without the snapshots, for callers that do not look at them.

    Only brokers declaring ``capabilities.quiet_enqueue`` implement it.
    """

    def enqueue_quiet(self, tasks: Sequence[NewTask]) -> builtins.list[Status]:
        """`Broker.enqueue` of ``tasks``, exactly -- the same unit, the same writes, the same
        errors, the same wake-ups -- except that each task is answered by its status on
        arrival (pending, blocked, or canceled by a failed parent) instead of its snapshot.

        Building a snapshot per task is a third or more of a batch submit's cost in Python;
        `Gate.submit_many` returns only ids, and without a hook only the statuses matter
        (which queues to wake, which waiters to answer).
        """
        ...


@runtime_checkable
class AckCarrier(Protocol):
    """Quiet acks and the claim that follows them as one step.

    Brokers declaring ``capabilities.acks_in_claims`` implement it, and `Gate` uses it only
    for them. A broker may have it without declaring it where an ack write and a claim
    apart are faster (the SQL broker on PostgreSQL and MariaDB, whose servers run the two
    side by side on two connections).
    """

    def claim_after_acks(
        self, items: Sequence[AckItem], queue: str, limit: int, lease_ttl: timedelta
    ) -> tuple[builtins.list[QuietAckOutcome], builtins.list[Lease] | None]:
        """`QuietAcker.ack_many_quiet` of ``items``, then `Broker.claim` of ``queue`` -- ONE
        broker call: the acks' answers in item order, and the leases.

        The claim sees what the acks wrote: a child they made ready is leased by it, due order
        permitting. Items or arguments `ack_many_quiet` or `claim` would refuse raise before anything is
        written or claimed. A claim that fails once the acks are written is answered with
        None for the leases (the acks stand); a broker whose call is one transaction raises
        instead, having written nothing.

        Under load a queue's finished handlers and its next claim come together: a worker
        cycle then takes one round trip (one commit, one thread hop) instead of two.
        """
        ...

    def claim_within_quota_after_acks(
        self,
        items: Sequence[AckItem],
        queue: str,
        limit: int,
        lease_ttl: timedelta,
        *,
        key: str,
        quota_limit: int,
        period: timedelta,
    ) -> tuple[builtins.list[QuietAckOutcome], QuotaClaim | None]:
        """`QuietAcker.ack_many_quiet` of ``items``, then `Broker.claim_within_quota` -- ONE
        broker call, answered and failing as `claim_after_acks` is."""
        ...


@runtime_checkable
class LimitedAckCarrier(Protocol):
    """`AckCarrier` for a broker's limited claims (`DistributedLimiter.claim_with_limits`).

    Only brokers declaring both ``capabilities.acks_in_claims`` and ``distributed_limits``
    implement it.
    """

    def claim_with_limits_after_acks(
        self,
        items: Sequence[AckItem],
        queue: str,
        capacity: int,
        limit: int,
        lease_ttl: timedelta,
        *,
        rps: float = 0.0,
        burst: int = 0,
        quota: QuotaSpec | None = None,
        release: Sequence[str] = (),
        claimer: str = "",
    ) -> tuple[builtins.list[QuietAckOutcome], LimitedClaim | None]:
        """`QuietAcker.ack_many_quiet` of ``items``, then `DistributedLimiter.claim_with_limits`
        -- ONE broker call, answered and failing as `AckCarrier.claim_after_acks` is."""
        ...


@runtime_checkable
class DistributedLimiter(Protocol):
    """Global concurrency slots and rate for a queue, shared by every process of a broker.

    Only brokers declaring ``capabilities.distributed_limits`` implement it.
    """

    def acquire_slots(self, queue: str, capacity: int, n: int, ttl: timedelta) -> list[str]:
        """Take up to ``n`` of the queue's ``capacity`` slots, each expiring after ``ttl``."""
        ...

    def claim_with_limits(
        self,
        queue: str,
        capacity: int,
        limit: int,
        lease_ttl: timedelta,
        *,
        rps: float = 0.0,
        burst: int = 0,
        quota: QuotaSpec | None = None,
        release: Sequence[str] = (),
        claimer: str = "",
    ) -> LimitedClaim:
        """`Broker.claim` of up to ``limit`` due tasks, each under one of the queue's ``capacity``
        slots, that also takes per task claimed one start of `take_rate`'s limiter (``rps`` > 0)
        and one unit of ``quota``'s current window -- ONE atomic step.

        Each slot's token is its lease's token and expires with the lease (``lease_ttl``);
        renew and release it by that token like any slot. Slots, starts and units are spent
        only for tasks claimed. ``release`` gives those slot
        tokens back first (as `release_slots` would), so they count as free for this claim.
        A ``claimer`` id makes claimers take turns: one that found no free slot while tasks
        were due is owed one, which every other claimer leaves free until it came back.
        """
        ...

    def renew_slots(self, queue: str, tokens: Sequence[str], ttl: timedelta) -> list[str]:
        """Extend held slots to ``now + ttl``; returns the tokens that were no longer held."""
        ...

    def release_slots(self, queue: str, tokens: Sequence[str]) -> None:
        """Give slots back; a token not held is ignored (released at most once)."""
        ...

    def take_rate(self, queue: str, rps: float, burst: int, n: int) -> tuple[int, float]:
        """Take up to ``n`` starts from the queue's GCRA limiter.

        Returns ``(granted, retry_after_seconds)``: when ``granted < n``, the wait before the
        next start may be allowed.
        """
        ...
