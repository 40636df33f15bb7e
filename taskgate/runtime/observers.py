"""What a gate tells the instruments it carries (metrics) beyond what middleware sees.

Middleware wraps a handler's call; an `Observer` is also told of what happens around it: the
tasks a submit stored and how long it took, the outcome each run was written with, and the
broker calls that failed. An instrument subclasses `Observer` and is a middleware as well
(`taskgate.metrics.Prometheus`): the gate finds it in ``Config.middleware`` (or is given it by
`Gate.instrument`) and calls `Observer.bind` once. Observers are called on the event loop and
must not block it; whatever one raises is logged and ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING

from taskgate.brokers.base import FailureKind, NewTask
from taskgate.runtime.outcome import Ack, Discard, Fail, Outcome, Retry, Stop, StopReason
from taskgate.task import Task

if TYPE_CHECKING:
    from taskgate.runtime.runner import Runtime

__all__ = ["CURRENT_QUEUE", "Observer", "Observers", "outcome_name"]

log = logging.getLogger("taskgate")

# The queue whose scheduler (or worker) the current anyio task belongs to; "" elsewhere (a
# submit, the reaper). Set once per scheduler: its tasks inherit it, so a broker call that
# fails is counted against its queue without passing the name down every call.
CURRENT_QUEUE: ContextVar[str] = ContextVar("taskgate_current_queue", default="")


class Observer:
    """Told of a gate's submits, run outcomes and failed broker calls; every method does nothing
    unless overridden."""

    def bind(self, runtime: Runtime) -> None:
        """Called once by each gate that carries this observer, before it submits or runs."""

    def submitted(self, tasks: Sequence[NewTask], seconds: float) -> None:
        """``tasks`` were stored by one submit, which took ``seconds``."""

    def finished(self, task: Task, outcome: str) -> None:
        """A run of ``task`` (its snapshot as claimed) ended with ``outcome``: completed, failed,
        retried, throttled, canceled or lease_lost."""

    def broker_failed(self, queue: str, exc: BaseException) -> None:
        """A broker call of ``queue``'s scheduler or workers ("" for another) raised ``exc``."""


class Observers:
    """The observers of one gate, told of each event in turn; one that raises is logged."""

    def __init__(self) -> None:
        self.items: list[Observer] = []

    def __bool__(self) -> bool:
        return bool(self.items)  # the runtime's hot paths test ``.items`` itself

    def add(self, observer: Observer, runtime: Runtime) -> None:
        """Bind ``observer`` to ``runtime`` and tell it of events from now on (once only)."""
        if any(item is observer for item in self.items):
            return
        observer.bind(runtime)
        self.items.append(observer)

    def submitted(self, tasks: Sequence[NewTask], seconds: float) -> None:
        """`Observer.submitted` on each."""
        for item in self.items:
            try:
                item.submitted(tasks, seconds)
            except Exception:
                log.exception("observer %r failed on a submit; ignored", item)

    def finished(self, task: Task, outcome: Outcome) -> None:
        """`Observer.finished` on each, for an outcome that ends a run (not a shutdown's)."""
        name = outcome_name(outcome)
        if name is None:
            return
        for item in self.items:
            try:
                item.finished(task, name)
            except Exception:
                log.exception("observer %r failed on task %s's outcome; ignored", item, task.id)

    def broker_failed(self, exc: BaseException) -> None:
        """`Observer.broker_failed` on each, naming the current queue (`CURRENT_QUEUE`)."""
        queue = CURRENT_QUEUE.get()
        for item in self.items:
            try:
                item.broker_failed(queue, exc)
            except Exception:
                log.exception("observer %r failed on a broker error; ignored", item)


def outcome_name(outcome: Outcome) -> str | None:
    """The name of the outcome a run ended with; None for a run put back by shutdown."""
    match outcome:
        case Ack():
            return "completed"
        case Retry(kind=FailureKind.THROTTLED):
            return "throttled"
        case Retry():
            return "retried"
        case Fail():
            return "failed"
        case Stop(StopReason.CANCELED):
            return "canceled"
        case Discard():
            return "lease_lost"
    return None
