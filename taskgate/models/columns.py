"""The columns of taskgate's tables, as declarative mixins.

The mixins carry the columns only; `taskgate.models.build` turns each into a mapped class
under a table prefix, adding the keys, indexes and foreign keys whose names depend on it.
Strings are ``VARCHAR(255)`` because MySQL can index no longer ``utf8mb4`` keys comfortably,
and every id, type, queue and key is checked against that length at the API. Each is an
`ExactString`: on MySQL/MariaDB a NO PAD binary collation, so 'k' and 'k ' are two keys.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Integer, text
from sqlalchemy.orm import Mapped, mapped_column

from taskgate.ids import MAX_ID_LENGTH
from taskgate.models.types import Blob, ExactString, LongText, UTCDateTime

__all__ = [
    "BusinessKeyColumns",
    "DependencyColumns",
    "LeaseColumns",
    "QueueLimitColumns",
    "QuotaWindowColumns",
    "SlotColumns",
    "StepColumns",
    "TaskColumns",
]

# Every string column compares exactly (trailing spaces included) on every database.
Name = ExactString(MAX_ID_LENGTH)


class TaskColumns:
    """One execution of a task: what to run, where it stands, and its counters."""

    id: Mapped[str] = mapped_column(Name)
    type: Mapped[str] = mapped_column(Name)
    queue: Mapped[str] = mapped_column(Name)
    status: Mapped[str] = mapped_column(ExactString(16))
    # True exactly while status is pending or retrying: lets ONE index (queue, ready,
    # priority DESC, run_at, id) serve the claim in its order and stop after k rows, which an
    # index on (queue, status, ...) cannot do for two statuses at once.
    ready: Mapped[bool] = mapped_column(Boolean)
    # Claimed before the due tasks of lower priority. The server default gives rows written
    # before the column existed (or by an older version during a rolling deploy) priority 0.
    priority: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    run_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    payload: Mapped[bytes | None] = mapped_column(Blob)
    result: Mapped[bytes | None] = mapped_column(Blob)
    last_error: Mapped[str | None] = mapped_column(LongText)
    attempts: Mapped[int] = mapped_column(Integer)
    max_retry: Mapped[int] = mapped_column(Integer)
    throttled: Mapped[int] = mapped_column(Integer)
    lease_lost: Mapped[int] = mapped_column(Integer)
    claims: Mapped[int] = mapped_column(Integer)
    ignore_parent_failure: Mapped[bool] = mapped_column(Boolean)
    # ``depends_on`` as a JSON list, in the order given. The edges table is what the graph is
    # walked by; this copy (parents never change) spares every snapshot a second query.
    depends_on: Mapped[str] = mapped_column(LongText)
    business_key: Mapped[str | None] = mapped_column(Name)
    replay_of: Mapped[str | None] = mapped_column(Name)
    # The tenant (or any other share of the queue) whose own limits the task runs under.
    group_name: Mapped[str | None] = mapped_column(Name)
    # Milliseconds a run may take before its handler is cancelled; None: the queue's setting.
    timeout_ms: Mapped[int | None] = mapped_column(BigInteger)
    # The formatted traceback of the handler's latest exception, its newest 8 KiB.
    last_traceback: Mapped[str | None] = mapped_column(LongText)
    # A handler's progress report: a JSON document of at most 64 KiB.
    progress: Mapped[str | None] = mapped_column(LongText)
    # The submitter's trace context (W3C traceparent/tracestate), for the run's span.
    trace_context: Mapped[str | None] = mapped_column(LongText)


class DependencyColumns:
    """One edge of the dependency graph: ``child_id`` waits for ``parent_id``.

    ``position`` keeps ``depends_on`` in the order it was given (a parent may repeat).
    """

    child_id: Mapped[str] = mapped_column(Name)
    position: Mapped[int] = mapped_column(Integer)
    parent_id: Mapped[str] = mapped_column(Name)


class LeaseColumns:
    """The lease of a running task, apart from the wide task row so heartbeats stay cheap."""

    task_id: Mapped[str] = mapped_column(Name)
    token: Mapped[str] = mapped_column(ExactString(64))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    cancel_requested: Mapped[bool] = mapped_column(Boolean)


class QuotaWindowColumns:
    """Units used in one epoch-aligned window of a quota key."""

    quota_key: Mapped[str] = mapped_column(Name)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime())
    window_end: Mapped[datetime] = mapped_column(UTCDateTime())
    used: Mapped[int] = mapped_column(Integer)
    quota_limit: Mapped[int] = mapped_column(Integer)


class BusinessKeyColumns:
    """A used business key and its newest execution.

    Its primary key is what makes exactly one of many racing submitters of a key win.
    """

    business_key: Mapped[str] = mapped_column(Name)
    execution_id: Mapped[str] = mapped_column(Name)


class QueueLimitColumns:
    """What one queue, or one group of it, shares across processes besides its slots.

    ``group_name`` is ``''`` for the queue as a whole. ``rate_tat`` is the rate limiter's
    theoretical arrival time (GCRA): starts are allowed while it is at most ``burst``
    intervals ahead of now. ``held_until``: no claim before then (a pause or a queue-wide
    throttle). ``waiters``: the claimers owed a turn at the next free slot, as a JSON object of
    claimer id -> until when (microseconds since the epoch) -- a handful of entries, read and
    written with the row the claim locks anyway, so turn-taking costs no statement of its own.
    ``quota_window``/``quota_used``: a group's quota, the start of the window its units were
    last taken from and how many (a queue's own quota is a `QuotaWindowColumns` row).
    """

    queue: Mapped[str] = mapped_column(Name)
    group_name: Mapped[str] = mapped_column(Name)
    rate_tat: Mapped[datetime | None] = mapped_column(UTCDateTime())
    held_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    waiters: Mapped[str | None] = mapped_column(LongText)
    quota_window: Mapped[datetime | None] = mapped_column(UTCDateTime())
    quota_used: Mapped[int | None] = mapped_column(Integer)


class SlotColumns:
    """One of a queue's shared concurrency slots, held under a lease's token until given back
    or until ``expires_at`` (renewed with the lease), so a crashed holder's slot comes back."""

    queue: Mapped[str] = mapped_column(Name)
    token: Mapped[str] = mapped_column(ExactString(64))
    group_name: Mapped[str | None] = mapped_column(Name)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


class StepColumns:
    """The stored result of one durable step of a task (`taskgate.step`): the JSON its first
    run got, given back to every later run of the same execution instead of running it again."""

    task_id: Mapped[str] = mapped_column(Name)
    name: Mapped[str] = mapped_column(Name)
    result: Mapped[bytes] = mapped_column(Blob)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
