"""`Prometheus`: taskgate's metrics in a ``prometheus_client`` registry.

One object is both a middleware (it times each run and counts it started, running and the
handler's exceptions by type) and an `Observer` of the gates carrying it (submits, the outcome
each run was written with, failed broker calls). The gauges read from the store -- queue depth
and quota windows -- are a collector (`StoreGauges`) asked at scrape.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from taskgate.brokers.base import NewTask
from taskgate.metrics.store import StoreGauges
from taskgate.middleware import CallNext
from taskgate.runtime.observers import Observer
from taskgate.task import Task

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from taskgate.runtime.runner import Runtime

__all__ = ["Prometheus"]

# Waits and runs of LLM calls reach minutes: the default buckets stop at 10 s.
LONG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class Prometheus(Observer):
    """taskgate's metrics, registered in ``registry`` (None: ``prometheus_client.REGISTRY``).

    Pass it in ``Config(middleware=[...])`` or install it with `Gate.instrument`; one object may
    serve several gates (their figures add up). Counters: ``taskgate_submitted_total{queue,type}``,
    ``taskgate_started_total{queue,type}``, ``taskgate_finished_total{queue,type,outcome}``
    (completed, failed, canceled, retried, throttled, lease_lost),
    ``taskgate_errors_total{queue,kind}`` (``kind="broker"`` for a broker call that failed,
    ``queue=""`` outside a queue's work; else the type name of the exception a handler raised).
    Histograms (seconds): ``taskgate_submit_duration_seconds{queue}``,
    ``taskgate_wait_seconds{queue}`` (from due to start, on the store's clock),
    ``taskgate_run_seconds{queue,type}``. Gauges: ``taskgate_running{queue}`` (handlers running
    in this process), and read from the store at scrape, at most once a second:
    ``taskgate_queue_depth{queue,status}`` (blocked, pending, running, retrying),
    ``taskgate_quota_used{quota_key}`` and ``taskgate_quota_limit{quota_key}``.
    Raises `ImportError` naming the extra when ``prometheus_client`` is not installed.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        try:
            import prometheus_client as pc
        except ImportError as exc:
            raise ImportError(
                "taskgate.metrics.Prometheus needs: pip install 'taskgate[prometheus]'"
            ) from exc
        where: dict[str, Any] = {"registry": registry if registry is not None else pc.REGISTRY}
        self.registry = where["registry"]
        # First in the registry: a scrape reads the store before it collects the error counter,
        # so a read that fails is counted in the same scrape.
        self._store = StoreGauges(on_error=self._store_failed)
        self.registry.register(self._store)
        self._submitted = pc.Counter("taskgate_submitted", "Tasks submitted.", ["queue", "type"], **where)
        self._started = pc.Counter("taskgate_started", "Handler runs started.", ["queue", "type"], **where)
        self._finished = pc.Counter(
            "taskgate_finished", "Handler runs ended, by outcome.", ["queue", "type", "outcome"], **where
        )
        self._errors = pc.Counter(
            "taskgate_errors",
            "Broker errors (kind=broker) and handler exceptions by type.",
            ["queue", "kind"],
            **where,
        )
        self._submit_seconds = pc.Histogram(
            "taskgate_submit_duration_seconds", "Time to store one submit.", ["queue"], **where
        )
        self._wait_seconds = pc.Histogram(
            "taskgate_wait_seconds", "From due to start.", ["queue"], buckets=LONG_BUCKETS, **where
        )
        self._run_seconds = pc.Histogram(
            "taskgate_run_seconds", "Handler run time.", ["queue", "type"], buckets=LONG_BUCKETS, **where
        )
        self._running = pc.Gauge("taskgate_running", "Handlers running in this process.", ["queue"], **where)

    def bind(self, runtime: Runtime) -> None:
        """Read ``runtime``'s store at scrape too (see `StoreGauges`)."""
        self._store.add(runtime)

    async def __call__(self, task: Task, call_next: CallNext) -> Any:
        """The middleware: count and time the run around ``call_next``."""
        queue = task.queue
        self._started.labels(queue, task.type).inc()
        if task.started_at is not None:
            self._wait_seconds.labels(queue).observe(
                max(0.0, (task.started_at - task.run_at).total_seconds())
            )
        running = self._running.labels(queue)
        running.inc()
        began = time.perf_counter()
        try:
            return await call_next()
        except Exception as exc:
            self._errors.labels(queue, type(exc).__name__).inc()
            raise
        finally:
            running.dec()
            self._run_seconds.labels(queue, task.type).observe(time.perf_counter() - began)

    def submitted(self, tasks: Sequence[NewTask], seconds: float) -> None:
        """Count one submit's tasks and time it (per queue)."""
        counts: dict[tuple[str, str], int] = {}
        for task in tasks:
            key = (task.queue, task.type)
            counts[key] = counts.get(key, 0) + 1
        for (queue, task_type), count in counts.items():
            self._submitted.labels(queue, task_type).inc(count)
        for queue in {queue for queue, _ in counts}:
            self._submit_seconds.labels(queue).observe(seconds)

    def finished(self, task: Task, outcome: str) -> None:
        """Count a run's outcome."""
        self._finished.labels(task.queue, task.type, outcome).inc()

    def broker_failed(self, queue: str, exc: BaseException) -> None:
        """Count a failed broker call."""
        self._errors.labels(queue, "broker").inc()

    def _store_failed(self, exc: BaseException) -> None:
        self._errors.labels("", "broker").inc()
