"""What `Gate.stats` reports: one read of a queue's state from the store, or -- while the store
does not answer -- this process's last known figures, marked unreachable.

The backlog and the quota window are read from the shared medium (`Broker.queue_state`), so a
process that runs no workers (a web process, a CLI) sees what the workers spent, and
``quota_exhausted`` follows from those figures, not from one worker's memory. A stats call is
what a dashboard polls while the store may be down, so it never raises for the store: a
`BrokerError`, or no answer within the deadline of a worker's broker call, answers the last
figures this gate read for the queue with ``reachable=False``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from taskgate.brokers.base import QuotaSpec
from taskgate.brokers.params import QueueQuery, QueueState, Unhandled
from taskgate.config import Config, QueueConfig
from taskgate.errors import BrokerError
from taskgate.runtime.runner import worker_deadline
from taskgate.task import QueueStats

if TYPE_CHECKING:
    from taskgate.runtime.runner import Runtime

__all__ = ["StatsReader"]

log = logging.getLogger("taskgate")

# What a queue reads as before the store ever answered for it: nothing known.
_NOTHING_READ = QueueState(queue_len=0)


class StatsReader:
    """Reads `QueueStats` for a gate, keeping each queue's last `QueueState` for when the store
    cannot be reached."""

    def __init__(self, config: Config, runtime: Runtime) -> None:
        self._config = config
        self._runtime = runtime
        self._last: dict[str, QueueState] = {}
        self._down = False  # the last read failed: later failures log at DEBUG only

    async def read(self, queue: str, conf: QueueConfig) -> QueueStats:
        """``queue``'s stats: ONE `Broker.queue_state` call (with its quota, if any, and the
        unhandled count), under a worker call's deadline; the last figures with
        ``reachable=False`` when it fails."""
        spec = self._quota_spec(queue, conf)
        unhandled = Unhandled(after=2 * conf.lease, handled=self._runtime.handled_types(queue))
        state, reachable = await self._state(QueueQuery(queue, spec, unhandled), worker_deadline(conf))
        scheduler = self._runtime.schedulers.get(queue)
        local_quota = scheduler.quota if scheduler is not None else None
        usage = state.quota
        return QueueStats(
            workers=conf.workers,
            running=scheduler.running if scheduler is not None else 0,
            queue_len=state.queue_len,
            rps=float(conf.rps),
            quota_exhausted=usage is not None and usage.used >= usage.limit,
            quota_stalled=bool(local_quota and local_quota.stalled),
            quota_limit=spec.limit if spec is not None else 0,
            quota_used=usage.used if usage is not None else 0,
            quota_window_end=usage.window_end if usage is not None else None,
            reachable=reachable,
            paused_until=state.held_until,
            unhandled=state.unhandled,
            max_pending=conf.max_pending,
        )

    def _quota_spec(self, queue: str, conf: QueueConfig) -> QuotaSpec | None:
        key = self._config.quota_key(queue)
        if key is None or conf.period is None:
            return None
        return QuotaSpec(key=key, limit=conf.quota_limit, period=conf.period)

    async def _state(self, query: QueueQuery, deadline: float) -> tuple[QueueState, bool]:
        try:
            state = await self._runtime.calls(self._config.broker.queue_state, query, deadline=deadline)
        except BrokerError as exc:
            self._note_unreachable(query.queue, exc)
            return self._last.get(query.queue, _NOTHING_READ), False
        self._last[query.queue] = state
        if self._down:
            self._down = False
            log.info("stats: the store answers again (queue %r)", query.queue)
        return state, True

    def _note_unreachable(self, queue: str, exc: BrokerError) -> None:
        level = logging.DEBUG if self._down else logging.WARNING
        self._down = True
        log.log(
            level, "stats of queue %r: the store did not answer (%s); last known figures given", queue, exc
        )
