"""What a finished run means for its task: the retry policy, as pure decisions.

`decide` maps a handler's exception to one broker transition; `Executor` carries it out.
Nothing here touches the broker, so every path is unit-tested with plain values.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum

from taskgate.backoff import Backoff
from taskgate.brokers.base import FailureKind
from taskgate.brokers.checks import storable_error
from taskgate.brokers.params import Compensation
from taskgate.errors import SkipRetry, Throttled, UnknownTypeError, check_retry_after, check_scope
from taskgate.task import Task

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_POLICY",
    "Ack",
    "Discard",
    "Fail",
    "HandlerPolicy",
    "Outcome",
    "Policy",
    "Retry",
    "RetryIf",
    "Stop",
    "StopReason",
    "decide",
    "describe",
    "unknown_type",
    "unstorable_result",
]


log = logging.getLogger("taskgate")

DEFAULT_BACKOFF = Backoff()

# Whether an ordinary exception a handler raised is worth another try.
RetryIf = Callable[[Exception], object]


@dataclass(frozen=True, slots=True)
class Policy:
    """What decides the retries of one task: ``retry_if`` (None: every ordinary exception is
    retried) and the `Backoff` between tries."""

    backoff: Backoff = DEFAULT_BACKOFF
    retry_if: RetryIf | None = None


DEFAULT_POLICY = Policy()


@dataclass(frozen=True, slots=True)
class HandlerPolicy:
    """The options a handler was registered with (`Gate.handle`); None: not given."""

    backoff: Backoff | None = None
    retry_if: RetryIf | None = None
    timeout: timedelta | None = None
    compensation: Compensation | None = None


class StopReason(Enum):
    """Why the runtime stopped a handler from outside (or the handler learned it must stop)."""

    CANCELED = "canceled"  # a cancel was requested: finish_canceled
    LEASE_LOST = "lease_lost"  # reaped or fenced: write nothing, the reaper owns the task
    SHUTDOWN = "shutdown"  # shutdown timed out or the runtime was cancelled: requeue untouched


@dataclass(frozen=True, slots=True)
class Ack:
    """Complete with ``result``."""

    result: bytes | None


@dataclass(frozen=True, slots=True)
class Retry:
    """Back to ``retrying`` after ``delay`` seconds, counting ``kind``; ``hold_queue``: the
    task's queue is held as long (a queue-wide throttle); ``traceback``: the handler's, to store."""

    kind: FailureKind
    error: str
    delay: float
    hold_queue: bool = False
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """Failed for good, counting ``kind``; ``traceback``: the handler's, to store."""

    kind: FailureKind
    error: str
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """Stopped from outside for ``reason``."""

    reason: StopReason


@dataclass(frozen=True, slots=True)
class Discard:
    """Write nothing (the result of a run that lost its lease)."""


Outcome = Ack | Retry | Fail | Stop | Discard


def describe(exc: BaseException) -> str:
    """The ``last_error`` text of an exception: ``"TypeName: message"``, storable on every
    backend (`storable_error`), also when the exception's ``__str__`` raises."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception as broken:  # a handler's own exception class: its text is all it can break
        text = f"<str() of the exception raised {type(broken).__name__}>"
    return storable_error(f"{name}: {text}" if text else name)


def unstorable_result(exc: BaseException) -> Fail:
    """The outcome for a handler whose result cannot be stored (the codec or the broker
    refused it): failed once with the reason, as a `SkipRetry` would -- a retry would compute
    a result that can never be stored again."""
    return Fail(
        FailureKind.SKIP, storable_error(f"the handler's result could not be stored: {describe(exc)}")
    )


def unknown_type(task: Task) -> Fail:
    """The outcome for a task whose type has no handler in this process: claims ask only for
    handled types (`Claim.types`), so only a broker that leased another type anyway gets here."""
    error = UnknownTypeError(f"no handler registered for task type {task.type!r} in this process")
    return Fail(FailureKind.SKIP, describe(error))


def decide(
    exc: BaseException,
    task: Task,
    *,
    throttled_max: int,
    policy: Policy = DEFAULT_POLICY,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """The retry path for a handler that raised ``exc`` while running ``task``.

    `Throttled` retries after ``retry_after`` until ``throttled_max`` throttles; `SkipRetry`
    fails at once; anything else counts an attempt and, while ``attempts <= max_retry`` and
    ``policy.retry_if`` (if any) says yes, retries after ``policy.backoff``.
    """
    if isinstance(exc, Throttled):
        try:
            # Checked at construction; again here for one whose attributes changed since.
            retry_after = check_retry_after(getattr(exc, "retry_after", None))
            whole_queue = check_scope(getattr(exc, "scope", "task")) == "queue"
        except (TypeError, ValueError) as bad:
            return decide(bad, task, throttled_max=throttled_max, policy=policy, rand=rand)
        if task.throttled + 1 > throttled_max:
            return Fail(FailureKind.THROTTLED, describe(exc))  # failed for good: no hold either
        return Retry(FailureKind.THROTTLED, describe(exc), retry_after, hold_queue=whole_queue)
    if isinstance(exc, SkipRetry):
        return Fail(FailureKind.SKIP, describe(exc))
    attempts = task.attempts + 1
    if attempts <= task.max_retry and _retried(policy.retry_if, exc, task):
        return Retry(FailureKind.BUSINESS, describe(exc), policy.backoff.delay(attempts, rand))
    return Fail(FailureKind.BUSINESS, describe(exc))


def _retried(retry_if: RetryIf | None, exc: BaseException, task: Task) -> bool:
    """``retry_if(exc)``'s answer; a ``retry_if`` that raises answers no (logged), and an
    exception that is not an `Exception` (a handler's own `BaseException`) is never offered."""
    if retry_if is None:
        return True
    if not isinstance(exc, Exception):
        return False
    try:
        return bool(retry_if(exc))
    except Exception:
        log.exception(
            "task %s: retry_if raised on %s; the task fails without retrying", task.id, describe(exc)
        )
        return False
