"""`StoreGauges`: the gauges read from the store when Prometheus scrapes.

``taskgate_queue_depth{queue,status}`` comes from `Broker.counts` (by type, each type summed
into the queue its gate routes it to), ``taskgate_quota_used`` / ``taskgate_quota_limit``
``{quota_key}`` from `Broker.queue_state` of one queue per quota key. A scrape runs in the
thread that asks for it -- ``prometheus_client``'s HTTP server thread, or a web handler's --
so the broker's synchronous methods are called directly (every broker is safe to call from
any thread), never the gate's event loop. What was read is kept for `MIN_AGE` seconds, so
scrapes in a burst cost the store one read; a read that fails is counted
(``taskgate_errors_total{queue="",kind="broker"}``) and answers what was read last.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from taskgate.brokers.base import Broker, QuotaSpec
from taskgate.brokers.params import QueueQuery
from taskgate.task import FINAL_STATUSES, Status

if TYPE_CHECKING:
    from taskgate.runtime.runner import Runtime

__all__ = ["MIN_AGE", "StoreGauges"]

log = logging.getLogger("taskgate")

MIN_AGE = 1.0  # seconds a read of the store is served before the next scrape reads again

# The statuses a queue's depth counts: every one a task can still leave.
DEPTH_STATUSES = tuple(status for status in Status if status not in FINAL_STATUSES)

# (queue, status) -> tasks; quota key -> (used, limit)
Depths = dict[tuple[str, str], int]
Quotas = dict[str, tuple[int, int]]


class StoreGauges:
    """A ``prometheus_client`` collector of the store's figures for the gates added to it."""

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self._runtimes: list[Runtime] = []
        self._on_error = on_error
        self._lock = threading.Lock()  # one scrape reads at a time; the others get its figures
        self._read_at = -MIN_AGE
        self._figures: tuple[Depths, Quotas] = ({}, {})

    def add(self, runtime: Runtime) -> None:
        """Read ``runtime``'s store (and its queues' quotas) from the next scrape on."""
        with self._lock:
            self._runtimes.append(runtime)
            self._read_at = -MIN_AGE

    def collect(self) -> Iterator[Any]:
        """The gauge families, from figures at most `MIN_AGE` seconds old."""
        from prometheus_client.core import GaugeMetricFamily

        depths, quotas = self._current()
        depth = GaugeMetricFamily(
            "taskgate_queue_depth", "Tasks in the store by queue and status.", labels=["queue", "status"]
        )
        for (queue, status), count in sorted(depths.items()):
            depth.add_metric([queue, status], count)
        used = GaugeMetricFamily(
            "taskgate_quota_used", "Units taken in the current window.", labels=["quota_key"]
        )
        limit = GaugeMetricFamily("taskgate_quota_limit", "Units per window.", labels=["quota_key"])
        for key, (taken, most) in sorted(quotas.items()):
            used.add_metric([key], taken)
            limit.add_metric([key], most)
        yield from (depth, used, limit)

    def describe(self) -> list[Any]:
        """Nothing: registering must not read the store (``prometheus_client`` would collect)."""
        return []

    def _current(self) -> tuple[Depths, Quotas]:
        with self._lock:
            if time.monotonic() - self._read_at >= MIN_AGE:
                try:
                    self._figures = self._read()
                except Exception as exc:  # the store is down: the last figures, counted
                    log.warning("metrics: reading the store failed: %s", exc)
                    self._on_error(exc)
                self._read_at = time.monotonic()
            return self._figures

    def _read(self) -> tuple[Depths, Quotas]:
        depths: Depths = {}
        quotas: Quotas = {}
        seen: set[int] = set()
        for runtime in self._runtimes:
            if id(runtime.broker) not in seen:  # gates sharing a broker share its counts
                seen.add(id(runtime.broker))
                _add_depths(depths, runtime)
            _add_quotas(quotas, runtime)
        return depths, quotas


def _add_depths(depths: Depths, runtime: Runtime) -> None:
    queue_for = runtime.config.queue_for
    for task_type, by_status in runtime.broker.counts().items():
        queue = queue_for(task_type)
        for status in DEPTH_STATUSES:
            key = (queue, status.value)
            depths[key] = depths.get(key, 0) + by_status.get(status, 0)


def _add_quotas(quotas: Quotas, runtime: Runtime) -> None:
    config = runtime.config
    for queue in sorted({*config.queues, *runtime.schedulers}):
        key, conf = config.quota_key(queue), config.queue_config(queue)
        if key is None or key in quotas or conf is None or conf.period is None:
            continue
        quotas[key] = _quota(runtime.broker, queue, QuotaSpec(key, conf.quota_limit, conf.period))


def _quota(broker: Broker, queue: str, spec: QuotaSpec) -> tuple[int, int]:
    usage = broker.queue_state(QueueQuery(queue, spec)).quota
    return (usage.used if usage is not None else 0), spec.limit
