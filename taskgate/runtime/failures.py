"""Making a handler's failure visible: its traceback for ``Task.last_traceback``, and one log
record on logger ``taskgate.handler``.

A failure that will be retried is logged at WARNING, one that is final at ERROR, both with the
exception (``exc_info``) and the task's id, type, queue and counters -- in the message and as
record attributes (``task_id``, ``task_type``, ``queue``, ``attempts``, ``max_retry``,
``throttled``, ``lease_lost``) for structured handlers. A `Throttled` re-queue is the gateway
being busy, not a failure: INFO, without the traceback (a 429 storm would otherwise flood the
log with identical ones); a throttle past ``throttled_max`` fails the task and is an ERROR.

Neither function raises: a traceback that cannot be formatted is described as well as it can
be, and a logging handler or filter that raises is ignored -- the task's outcome is written all
the same. The traceback's size is bounded where it is stored (`storable_traceback`: its
newest 8 KiB); formatting it costs nothing on runs that succeed.
"""

from __future__ import annotations

import logging
import traceback

from taskgate.brokers.base import FailureKind
from taskgate.runtime.outcome import Fail, Outcome, Retry, describe
from taskgate.task import Task

__all__ = ["HANDLER_LOGGER", "format_traceback", "log_failure"]

HANDLER_LOGGER = "taskgate.handler"

log = logging.getLogger(HANDLER_LOGGER)


def format_traceback(exc: BaseException) -> str:
    """The formatted traceback of ``exc`` (its chained causes included), never raising."""
    try:
        return "".join(traceback.format_exception(exc))
    except Exception as broken:  # a pathological exception object: say what we can
        return f"{describe(exc)}\n(its traceback could not be formatted: {describe(broken)})\n"


def log_failure(exc: BaseException, task: Task, outcome: Outcome) -> None:
    """Log ``task``'s handler failure ``exc``, which ``outcome`` settles; never raises."""
    try:
        _log(exc, task, outcome)
    except Exception:
        pass  # a broken logging setup must not stop the task's outcome


def _log(exc: BaseException, task: Task, outcome: Outcome) -> None:
    if not isinstance(outcome, Retry | Fail):
        return
    throttled = outcome.kind is FailureKind.THROTTLED
    attempts = task.attempts + (0 if throttled else 1)
    throttles = task.throttled + (1 if throttled else 0)
    context = {
        "task_id": task.id,
        "task_type": task.type,
        "queue": task.queue,
        "attempts": attempts,
        "max_retry": task.max_retry,
        "throttled": throttles,
        "lease_lost": task.lease_lost,
    }
    where = "task %s (type %s, queue %s)"
    counters = "attempts %d of max_retry %d, throttled %d, lease_lost %d"
    args = (task.id, task.type, task.queue)
    numbers = (attempts, task.max_retry, throttles, task.lease_lost)
    if isinstance(outcome, Retry):
        level = logging.INFO if throttled else logging.WARNING
        if log.isEnabledFor(level):
            message = f"{where} failed, retrying in %.3gs ({counters}): %s"
            info = None if throttled else exc
            values = (*args, outcome.delay, *numbers, outcome.error)
            log.log(level, message, *values, exc_info=info, extra=context)
    elif log.isEnabledFor(logging.ERROR):
        message = f"{where} failed for good ({counters}): %s"
        log.error(message, *args, *numbers, outcome.error, exc_info=exc, extra=context)
