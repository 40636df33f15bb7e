"""What each dashboard page shows, read from the broker: plain synchronous functions, each run
in ONE worker thread per page (`anyio.to_thread.run_sync`), never on the event loop.

The dashboard has the broker only, so a queue's figures are what the store knows (backlog,
hold, quota window, tasks due too long); its configured limits come from the ``queues`` the
app was given (`Catalog`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from taskgate.brokers.base import Broker, QuotaSpec
from taskgate.brokers.params import QueueQuery, Unhandled
from taskgate.config import Config, QueueConfig
from taskgate.errors import TaskNotFoundError
from taskgate.task import Filter, Status, Task

__all__ = [
    "Catalog",
    "Detail",
    "Overview",
    "Page",
    "QueueRow",
    "catalog_of",
    "read_detail",
    "read_overview",
    "read_page",
]

# How far back a page follows a replay chain (`Task.replay_of`), one read per step.
MAX_CHAIN = 20
# Due this long past without a claim, with no lease_ttl known, a task counts as unhandled.
DEFAULT_UNHANDLED_AFTER = timedelta(minutes=2)


@dataclass(frozen=True, slots=True)
class Catalog:
    """The queues the dashboard knows of, with their configured limits (from a `Config` or a
    mapping of `QueueConfig`); empty when it was given none."""

    queues: Mapping[str, QueueConfig] = field(default_factory=dict)
    config: Config | None = None

    def names(self, types: Iterable[str]) -> list[str]:
        """The configured queues, and with a `Config` the queues ``types`` are routed to."""
        found = set(self.queues)
        if self.config is not None:
            found.update(q for q in map(self.config.queue_for, types) if self.config.queue_config(q))
        return sorted(found)

    def conf(self, queue: str) -> QueueConfig | None:
        """``queue``'s limits, or None when unknown."""
        if self.config is not None:
            return self.config.queue_config(queue)
        return self.queues.get(queue)

    def quota(self, queue: str) -> QuotaSpec | None:
        """The quota budget ``queue`` draws from, or None."""
        conf = self.conf(queue)
        if conf is None or not conf.has_quota or conf.period is None:
            return None
        key = self.config.quota_key(queue) if self.config is not None else None
        return QuotaSpec(key=key or conf.quota_key or queue, limit=conf.quota_limit, period=conf.period)


def catalog_of(queues: Config | Mapping[str, QueueConfig] | None) -> Catalog:
    """The `Catalog` of the app's ``queues`` argument; `TypeError` for anything else."""
    if queues is None:
        return Catalog()
    if isinstance(queues, Config):
        return Catalog(dict(queues.queues), queues)
    if isinstance(queues, Mapping) and all(isinstance(q, QueueConfig) for q in queues.values()):
        return Catalog(dict(queues))
    raise TypeError(f"queues must be a taskgate.Config or a mapping of QueueConfig, got {queues!r}")


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue on the overview: configured limits (None: unknown) and the store's figures."""

    name: str
    workers: int | None
    rps: float | None
    running: int
    backlog: int
    held_until: datetime | None
    unhandled: int
    quota_limit: int = 0
    quota_used: int = 0
    window_end: datetime | None = None

    @property
    def quota_left(self) -> int:
        """Units left in the current window."""
        return max(0, self.quota_limit - self.quota_used)


@dataclass(frozen=True, slots=True)
class Overview:
    """The overview page: task counts by type and status, and the known queues."""

    counts: dict[str, dict[Status, int]]
    queues: list[QueueRow]


def read_overview(broker: Broker, catalog: Catalog) -> Overview:
    """Counts by type and status and a row per known queue."""
    counts = broker.counts()
    return Overview(counts, [_queue_row(broker, catalog, name) for name in catalog.names(counts)])


def _queue_row(broker: Broker, catalog: Catalog, name: str) -> QueueRow:
    conf = catalog.conf(name)
    after = 2 * conf.lease if conf is not None else DEFAULT_UNHANDLED_AFTER
    state = broker.queue_state(QueueQuery(name, catalog.quota(name), Unhandled(after=after)))
    running = len(broker.list(Filter(queue=name, status=Status.RUNNING)))
    quota = state.quota
    return QueueRow(
        name=name,
        workers=conf.workers if conf is not None else None,
        rps=float(conf.rps) if conf is not None else None,
        running=running,
        backlog=state.queue_len,
        held_until=state.held_until,
        unhandled=state.unhandled,
        quota_limit=quota.limit if quota is not None else 0,
        quota_used=quota.used if quota is not None else 0,
        window_end=quota.window_end if quota is not None else None,
    )


@dataclass(frozen=True, slots=True)
class Page:
    """One page of the task list, and whether a next page has tasks."""

    tasks: list[Task]
    more: bool


def read_page(broker: Broker, filter: Filter) -> Page:
    """The tasks ``filter`` selects (its limit > 0), reading one more to know of a next page."""
    found = broker.list(dataclasses.replace(filter, limit=filter.limit + 1))
    return Page(found[: filter.limit], len(found) > filter.limit)


@dataclass(frozen=True, slots=True)
class Detail:
    """A task's page: the task, its parents (None where one is gone), its children, the
    executions it replays (nearest first), and every execution of its business key."""

    task: Task
    parents: list[tuple[str, Task | None]]
    children: list[Task]
    replays: list[Task]
    executions: list[Task]


def read_detail(broker: Broker, task_id: str) -> Detail:
    """Everything a task's page shows; `TaskNotFoundError` for an unknown id."""
    task = broker.get(task_id)
    key = task.business_key
    return Detail(
        task=task,
        parents=[(parent, _get(broker, parent)) for parent in task.depends_on],
        children=broker.list(Filter(parent=task.id)),
        replays=_replay_chain(broker, task),
        executions=broker.list(Filter(business_key=key)) if key is not None else [],
    )


def _get(broker: Broker, task_id: str) -> Task | None:
    try:
        return broker.get(task_id)
    except TaskNotFoundError:
        return None  # pruned


def _replay_chain(broker: Broker, task: Task) -> list[Task]:
    chain: list[Task] = []
    current: Task | None = task
    while current is not None and current.replay_of is not None and len(chain) < MAX_CHAIN:
        current = _get(broker, current.replay_of)
        if current is not None:
            chain.append(current)
    return chain
