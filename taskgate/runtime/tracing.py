"""OpenTelemetry spans of submits and runs, active whenever ``opentelemetry`` is importable.

A submit opens a PRODUCER span ``taskgate submit <type>`` and stores its context with each
task it stores (``Task.trace_context``: the global propagator's headers -- W3C ``traceparent``
and ``tracestate`` by default -- as a JSON object). A run opens a CONSUMER span
``taskgate run <type>`` whose parent is that context, whichever process runs it, current while
the handler runs (its own spans are its children), with attributes ``taskgate.task.id``,
``taskgate.queue``, ``taskgate.attempt`` (the business attempt this run is: ``attempts + 1``)
and ``taskgate.outcome`` (completed, failed, retried, throttled, canceled, lease_lost, or
requeued by a shutdown). Spans go to the global tracer provider, looked for at most once a second:
until an application sets one (``trace.set_tracer_provider``, or the ``OTEL_PYTHON_TRACER_PROVIDER``
variable) no span is opened and nothing is stored with the task: a span nothing records would
cost every run for nothing. There is no switch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from taskgate.brokers.base import NewTask
from taskgate.runtime.observers import outcome_name
from taskgate.runtime.outcome import Fail, Outcome, Retry
from taskgate.task import Task

__all__ = ["RunSpan", "Submitting", "Tracing", "load_tracing"]

log = logging.getLogger("taskgate")

TRACER_NAME = "taskgate"
LOOK_EVERY = 1.0  # seconds between looks for a global tracer provider while none is set


def load_tracing() -> Tracing | None:
    """The tracing of a gate; None when ``opentelemetry`` is not installed."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return None
    return Tracing()


class Submitting:
    """The span of one submit: ``trace_context`` to store with its tasks."""

    __slots__ = ("span", "trace_context")

    def __init__(self, span: Any, trace_context: str | None) -> None:
        self.span, self.trace_context = span, trace_context

    def stored(self, tasks: Sequence[NewTask]) -> None:
        """Name the queue, the type and the stored task (``taskgate.task.id``), or the batch's size."""
        if not tasks:
            return
        self.span.set_attribute("taskgate.queue", tasks[0].queue)
        self.span.set_attribute("taskgate.task.type", tasks[0].type)
        if len(tasks) == 1:
            self.span.set_attribute("taskgate.task.id", tasks[0].id)
        else:
            self.span.set_attribute("messaging.batch.message_count", len(tasks))


# A run's span and the context token that made it current.
RunSpan = tuple[Any, object]


class _NoSpan:
    """The span of a submit while no provider is set: records nothing."""

    def set_attribute(self, key: str, value: object) -> None:
        """Nothing."""


_NOT_TRACED = Submitting(_NoSpan(), None)


class Tracing:
    """Opens taskgate's spans with the global tracer provider's tracer ``taskgate``."""

    def __init__(self) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.context import Context

        self._context, self._propagate, self._trace, self._empty = context, propagate, trace, Context
        # A proxy: it follows the global provider, also one set after this gate was built.
        self._tracer = trace.get_tracer(TRACER_NAME)
        self._producer, self._consumer = trace.SpanKind.PRODUCER, trace.SpanKind.CONSUMER
        self._unset = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self._active = False  # a global provider, once set, stays: then no more looking
        self._look_at = 0.0  # until then (monotonic seconds), none is set: looking costs a run

    @property
    def active(self) -> bool:
        """Whether an application set a global tracer provider (spans are then opened); one
        set meanwhile is seen within `LOOK_EVERY` seconds."""
        if self._active:
            return True
        now = time.monotonic()
        if now < self._look_at:
            return False
        self._active = not isinstance(self._trace.get_tracer_provider(), self._unset)
        self._look_at = now + LOOK_EVERY
        return self._active

    @contextmanager
    def submitting(self, task_type: str) -> Iterator[Submitting]:
        """The PRODUCER span of a submit of ``task_type`` (not checked yet: the submit checks
        it in the block), current in the block; a span doing nothing, and no context to store,
        while no provider is set."""
        if not self.active:
            yield _NOT_TRACED
            return
        with self._tracer.start_as_current_span(f"taskgate submit {task_type}", kind=self._producer) as span:
            carrier: dict[str, str] = {}
            self._propagate.inject(carrier)
            text = json.dumps(carrier, separators=(",", ":")) if carrier else None
            yield Submitting(span, text)

    def start_run(self, task: Task) -> RunSpan | None:
        """Open and make current the CONSUMER span of a run of ``task``; end it with `end_run`
        in the same anyio task. None while no provider is set."""
        if not self._active and not self.active:
            return None
        span = self._tracer.start_span(
            f"taskgate run {task.type}",
            context=self._parent(task),
            kind=self._consumer,
            attributes={
                "taskgate.task.id": task.id,
                "taskgate.queue": task.queue,
                "taskgate.attempt": task.attempts + 1,
            },
        )
        return span, self._context.attach(self._trace.set_span_in_context(span))

    def end_run(self, run: RunSpan, outcome: Outcome | None) -> None:
        """Record ``outcome`` (None: the run ended by an error of the runtime) and end the span."""
        span, token = run
        try:
            self._context.detach(token)  # type: ignore[arg-type]
        except Exception:  # detached elsewhere already: the span still ends
            log.debug("tracing: a run's context was not current at its end", exc_info=True)
        if outcome is not None:
            span.set_attribute("taskgate.outcome", outcome_name(outcome) or "requeued")
            if isinstance(outcome, Fail | Retry):
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, outcome.error))
        span.end()

    def _parent(self, task: Task) -> Any:
        """The submitter's context stored with ``task``; an empty one (a root span) without."""
        text = task.trace_context
        if text is None:
            return self._empty()
        try:
            carrier = json.loads(text)
        except ValueError:
            return self._empty()
        return self._propagate.extract(carrier) if isinstance(carrier, dict) else self._empty()
