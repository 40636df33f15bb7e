"""Every error taskgate raises, under one root, plus the two a handler raises to steer retries."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from taskgate.task import Status, Task

__all__ = [
    "AlreadyFinalError",
    "AlreadyReplayedError",
    "BrokerError",
    "CompletedNotAllowedError",
    "ConfigError",
    "LeaseLostError",
    "NoTaskError",
    "QueueFullError",
    "ReplayNotFinalError",
    "ShutdownError",
    "SkipRetry",
    "TaskCanceledError",
    "TaskExistsError",
    "TaskFailedError",
    "TaskNotFoundError",
    "TaskgateError",
    "Throttled",
    "UnknownTypeError",
]


class TaskgateError(Exception):
    """Root of every error raised by taskgate."""


class ConfigError(TaskgateError, ValueError):
    """Raised when a `Config`, `QueueConfig` or broker option is invalid; names field and value."""


class BrokerError(TaskgateError):
    """Raised when the storage medium fails (unreachable, timed out, rejected a statement).

    The original driver exception is chained as ``__cause__``.
    """


class TaskExistsError(TaskgateError):
    """Raised by `submit` when the business key already has an execution.

    Carries the newest execution of that key, so a caller can decide to `replay` it.
    """

    def __init__(self, business_key: str, execution_id: str, status: Status) -> None:
        super().__init__(
            f"business key {business_key!r} already has execution {execution_id} ({status.value})"
        )
        self.business_key = business_key
        self.execution_id = execution_id
        self.status = status


class TaskNotFoundError(TaskgateError, LookupError):
    """Raised when an execution id (or a parent named in ``depends_on``) does not exist."""


class LeaseLostError(TaskgateError):
    """Raised when a lease token is stale: the task was reaped or claimed again.

    The write carrying the stale token changed nothing; a handler's result is discarded.
    """


class TaskCanceledError(TaskgateError):
    """Raised by `renew_lease` when the running task was canceled; its scope is being cancelled."""


class AlreadyFinalError(TaskgateError):
    """Raised by `cancel` (or a worker write) on a task that is already completed/failed/canceled."""


class UnknownTypeError(TaskgateError):
    """A broker leased a task of a type the claiming process has no handler for (it asked only
    for the types it handles: a broker that ignores `Claim.types`); the task is failed with this
    message. A well-behaved broker never leases one: such tasks wait for a process that can run them."""


class ShutdownError(TaskgateError):
    """Raised by `submit` (and friends) after the gate has begun shutting down."""


class NoTaskError(TaskgateError, RuntimeError):
    """Raised by `renew_lease`, `set_progress` and `step` when called outside a running handler."""


class QueueFullError(TaskgateError):
    """Raised by a submit that would take a queue with ``QueueConfig.max_pending`` past it.

    ``queue`` is the full queue, ``max_pending`` its limit, ``waiting`` how many of its tasks
    the store counted waiting -- pending, retrying or blocked (it stops counting at the limit)
    -- and ``adding`` how many the submit brought to it. Nothing of the submit was stored.
    Raised at once with ``on_full="raise"``, by a batch larger than the limit, and by
    `Gate.enqueue_in`; with ``on_full="block"`` a submit waits for room instead.
    """

    def __init__(self, queue: str, max_pending: int, waiting: int, adding: int) -> None:
        super().__init__(
            f"queue {queue!r} is full: {waiting} task(s) waiting, max_pending={max_pending}; "
            f"{adding} more would exceed it"
        )
        self.queue = queue
        self.max_pending = max_pending
        self.waiting = waiting
        self.adding = adding

    def __reduce__(self) -> tuple[type[QueueFullError], tuple[str, int, int, int]]:
        return type(self), (self.queue, self.max_pending, self.waiting, self.adding)


class ReplayNotFinalError(TaskgateError):
    """Raised by `replay` when the execution is not final yet."""


class AlreadyReplayedError(TaskgateError):
    """Raised by `replay` when the execution is not the newest of its chain."""


class CompletedNotAllowedError(TaskgateError):
    """Raised by `replay` of a completed execution without ``allow_completed=True``."""


class TaskFailedError(TaskgateError):
    """Raised by `wait` when the task ended failed or canceled; ``.task`` is its final snapshot."""

    def __init__(self, task: Task) -> None:
        super().__init__(f"task {task.id} ({task.type}) ended {task.status.value}: {task.last_error}")
        self.task = task


class Throttled(Exception):
    """Raised by a handler when the gateway said "busy".

    The task is re-queued after ``retry_after`` seconds with ``throttled += 1``; attempts are
    untouched. After ``Config.throttled_max`` throttles the task fails.

    ``scope="queue"`` also holds the task's whole queue until ``retry_after`` has passed, on
    the store's clock: no process claims from it meanwhile (handlers already running finish),
    and a longer hold -- a `Gate.pause` -- is never shortened. ``scope="task"`` (the default)
    re-queues the task alone. Any other scope raises `ValueError` naming it.

    ``retry_after`` is a finite number of seconds from 0 to `MAX_RETRY_AFTER` (30 days);
    anything else (negative, NaN, infinite, larger, not a number) raises `ValueError` or
    `TypeError` here, so a handler that builds a bad one fails as any other raising handler.
    """

    #: The longest ``retry_after`` accepted, in seconds (30 days): a gateway asking for more
    #: is better served by failing the task than by parking it out of sight.
    MAX_RETRY_AFTER: ClassVar[float] = 30 * 86_400.0

    #: What a throttle holds back: the task alone, or its whole queue.
    SCOPES: ClassVar[tuple[str, ...]] = ("task", "queue")

    def __init__(self, retry_after: float = 1.0, message: str = "throttled", *, scope: str = "task") -> None:
        super().__init__(message)
        self.retry_after = check_retry_after(retry_after)
        self.scope = check_scope(scope)


def check_scope(value: object) -> str:
    """``value`` as a `Throttled.scope`: ``"task"`` or ``"queue"``."""
    if not isinstance(value, str) or value not in Throttled.SCOPES:
        raise ValueError(f"Throttled scope must be 'task' or 'queue', got {value!r}")
    return value


def check_retry_after(value: object) -> float:
    """``value`` as a `Throttled.retry_after`: finite seconds in ``[0, MAX_RETRY_AFTER]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"retry_after must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not 0 <= seconds <= Throttled.MAX_RETRY_AFTER:  # also refuses NaN
        raise ValueError(
            f"retry_after must be from 0 to {Throttled.MAX_RETRY_AFTER:.0f} seconds (30 days), got {value!r}"
        )
    return seconds


class SkipRetry(Exception):
    """Raised by a handler for a hopeless failure: the task fails at once, no retry.

    Accepts a message or the exception that made it hopeless (kept as ``__cause__``).
    """

    def __init__(self, reason: str | BaseException = "skip retry") -> None:
        super().__init__(str(reason))
        if isinstance(reason, BaseException):
            self.__cause__ = reason
