"""The task snapshot and its small companions: `Status`, `Filter`, `QueueStats`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

__all__ = ["FINAL_STATUSES", "Filter", "QueueStats", "Status", "Task"]


class Status(StrEnum):
    """Where a task stands. Values are the lower-case names, as stored."""

    BLOCKED = "blocked"
    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def is_final(self) -> bool:
        """True for completed, failed and canceled: no transition leaves these."""
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELED})


# Not slots=True: a snapshot is made per task per transition, and adopting a ready dict
# (`task_from_fields`) costs a tenth of the frozen __init__'s per-field object.__setattr__.
@dataclass(frozen=True)
class Task:
    """A frozen snapshot of one execution, as the broker stored it at read time.

    Datetimes are timezone-aware UTC. ``attempts`` counts business failures, ``throttled``
    gateway "busy" answers, ``lease_lost`` reaped leases and ``claims`` every claim.
    ``timeout`` is the task's own run-time limit, as submitted (whole milliseconds): a run
    still going after it is cancelled and counts as a business failure; None means its
    queue's ``QueueConfig.timeout`` applies, whichever process claims it. ``group`` is the
    group of its queue the task was submitted in (None: none), whose own limits
    (``QueueConfig.group_workers`` and the like) it counts against. ``last_traceback`` is the
    formatted traceback of the handler's latest exception (None: it never raised), cut to its
    newest 8 KiB -- `last_error` is that exception's ``"Type: message"``. ``progress_json`` is
    the JSON text a handler last stored with `taskgate.set_progress` (None: none); `progress`
    decodes it. ``trace_context`` is the submitter's OpenTelemetry context (a JSON object of
    propagation headers, e.g. ``traceparent``; None: none was active or OpenTelemetry is not
    installed), the parent of the span of each run. ``priority``: as submitted (0 unless
    given); among the due tasks of a queue a higher one is claimed first, then the earlier
    ``run_at``, then the smaller id.
    """

    id: str
    type: str
    queue: str
    payload: bytes | None
    status: Status
    created_at: datetime
    run_at: datetime
    result: bytes | None = None
    last_error: str | None = None
    attempts: int = 0
    max_retry: int = 0
    throttled: int = 0
    lease_lost: int = 0
    claims: int = 0
    depends_on: tuple[str, ...] = ()
    ignore_parent_failure: bool = False
    business_key: str | None = None
    replay_of: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    timeout: timedelta | None = None
    group: str | None = None
    last_traceback: str | None = None
    progress_json: str | None = None
    trace_context: str | None = None
    priority: int = 0
    cancel_requested: bool = field(default=False, compare=False)

    def json(self) -> Any:
        """Decode the payload as JSON (``None`` when there is no payload)."""
        return None if self.payload is None else json.loads(self.payload)

    def result_json(self) -> Any:
        """Decode the result as JSON (``None`` when there is no result)."""
        return None if self.result is None else json.loads(self.result)

    @property
    def first_run(self) -> bool:
        """True on the task's first claim (``claims == 1``): no earlier run of this execution
        started, so none stored a durable step (`taskgate.step`). A claim whose task was put
        back unstarted (a shutdown) counts too: the next run is not the first."""
        return self.claims == 1

    @property
    def progress(self) -> Any:
        """The value a handler last stored with `taskgate.set_progress` (None: none yet),
        decoded afresh on each access (so changing it changes no snapshot)."""
        return None if self.progress_json is None else json.loads(self.progress_json)


@dataclass(frozen=True, slots=True)
class Filter:
    """Selects tasks for `list`: filter, sort by ``(created_at, id)``, skip ``offset``, take ``limit``.

    ``limit=0`` means all. ``None`` fields match anything. ``parent``: the tasks that depend
    on that task (its children).
    """

    type: str | None = None
    queue: str | None = None
    status: Status | None = None
    business_key: str | None = None
    group: str | None = None
    limit: int = 0
    offset: int = 0
    parent: str | None = None

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError(f"Filter.limit must be >= 0, got {self.limit!r}")
        if self.offset < 0:
            raise ValueError(f"Filter.offset must be >= 0, got {self.offset!r}")
        if self.status is not None and not isinstance(self.status, Status):
            object.__setattr__(self, "status", Status(self.status))


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A queue's state: its configured limits, this process's running count, and what the
    shared store holds -- the backlog and the quota window, the same for every process.

    - ``workers``, ``rps``: as configured.
    - ``running``: handlers of the queue running in THIS process.
    - ``queue_len``: pending + retrying tasks of the queue in the store (due or not).
    - ``quota_limit``: units per window (0: the queue has no quota).
    - ``quota_used``: units taken from the current window, in the store (never above the limit;
      read by any process, including one that runs no workers).
    - ``quota_window_end``: when the current window ends, on the store's clock, timezone-aware
      UTC (None: no quota, or no figures read yet).
    - ``quota_exhausted``: ``quota_used >= quota_limit``: the queue claims nothing until the
      window ends (False without a quota).
    - ``quota_stalled``: a worker of THIS process could not reach the quota's store and claims
      nothing until it answers again (fails closed).
    - ``paused_until``: when the queue's hold ends, on the store's clock, timezone-aware UTC --
      a `Gate.pause`, or a queue-wide `Throttled` -- and ``datetime.max`` in UTC
      (``datetime.max.replace(tzinfo=UTC)``) while it is paused until resumed; None when it is
      not held. No process claims from a held queue.
    - ``unhandled`` (best effort): pending or retrying tasks of the queue, due for longer than
      ``2 * lease_ttl``, of a type THIS process has no handler for -- tasks no process claims
      because none registered a handler for their type (processes claim only the types they
      handle). A process with no handler in the queue (a web process) counts every type, so
      there a backlog the workers fall behind on counts as well.
    - ``max_pending``: as configured (0: no back-pressure); what it bounds is ``queue_len``
      plus the queue's blocked tasks.
    - ``reachable``: False when the store did not answer this read (or not within the deadline
      of a worker's broker call): ``queue_len``, ``quota_used``, ``quota_window_end``,
      ``quota_exhausted``, ``paused_until`` and ``unhandled`` are then the last this process
      read (0, None and False before any read), not current; ``running`` and
      ``quota_stalled`` are current.
    """

    workers: int
    running: int
    queue_len: int
    rps: float
    quota_exhausted: bool = False
    quota_stalled: bool = False
    quota_limit: int = 0
    quota_used: int = 0
    quota_window_end: datetime | None = None
    reachable: bool = True
    paused_until: datetime | None = None
    unhandled: int = 0
    max_pending: int = 0


TASK_FIELDS = tuple(f.name for f in fields(Task))

# Each status by its stored value (and by itself: a StrEnum member hashes as its value). For
# brokers' snapshots, where ``Status(value)`` costs ten times a look-up.
STATUS_BY_VALUE: dict[str, Status] = {status.value: status for status in Status}


def task_from_fields(values: dict[str, Any]) -> Task:
    """A `Task` that adopts ``values`` as its attributes, skipping the dataclass ``__init__``.

    For brokers, which make a snapshot per task per transition. ``values`` must hold exactly
    `TASK_FIELDS`, each already of its type (nothing is checked or converted), and is taken
    over, not copied: the caller must not keep or change it.
    """
    task = object.__new__(Task)
    object.__setattr__(task, "__dict__", values)
    return task
