"""The mutable record the memory broker keeps per task, and its frozen snapshot."""

from __future__ import annotations

from datetime import datetime, timedelta

from taskgate.task import Status, Task, task_from_fields

__all__ = ["Record"]


class Record:
    """One execution as stored; only the broker touches it, callers get `snapshot` copies.

    The task's own fields live in the instance ``__dict__`` -- exactly `taskgate.task.TASK_FIELDS`
    -- and the broker's bookkeeping in slots, so a snapshot is one copy of that dict (a
    snapshot is made per task per transition: claims and acks are the memory broker's hot path).
    The fields are set one by one, always in the same order, and never added or deleted later:
    CPython then keeps every record's dict as a key-sharing dict (PEP 412), values only --
    about 200 bytes a task less than a dict of its own (`memory.rss` in benchmarks/README.md).
    """

    __slots__ = ("__dict__", "lease_expires_at", "ready_seq", "steps", "token")

    id: str
    type: str
    queue: str
    payload: bytes | None
    status: Status
    created_at: datetime
    run_at: datetime
    result: bytes | None
    last_error: str | None
    attempts: int
    max_retry: int
    throttled: int
    lease_lost: int
    claims: int
    depends_on: tuple[str, ...]
    ignore_parent_failure: bool
    business_key: str | None
    replay_of: str | None
    started_at: datetime | None
    finished_at: datetime | None
    timeout: timedelta | None
    group: str | None
    last_traceback: str | None
    progress_json: str | None
    trace_context: str | None
    priority: int
    cancel_requested: bool
    # The lease's token and end while running; None otherwise.
    token: str | None
    lease_expires_at: datetime | None
    # Bumped each time the task enters a ready heap; older heap entries are then stale.
    ready_seq: int
    # The results of its durable steps (`Broker.step`), name -> JSON; None until the first.
    # Kept on the record, so whatever deletes the task deletes its steps.
    steps: dict[str, bytes] | None

    def __init__(
        self,
        *,
        id: str,
        type: str,
        queue: str,
        payload: bytes | None,
        status: Status,
        created_at: datetime,
        run_at: datetime,
        max_retry: int,
        depends_on: tuple[str, ...],
        ignore_parent_failure: bool,
        business_key: str | None,
        replay_of: str | None,
        timeout: timedelta | None,
        group: str | None,
        last_error: str | None = None,
        finished_at: datetime | None = None,
        trace_context: str | None = None,
        priority: int = 0,
    ) -> None:
        self.id = id
        self.type = type
        self.queue = queue
        self.payload = payload
        self.status = status
        self.created_at = created_at
        self.run_at = run_at
        self.result = None
        self.last_error = last_error
        self.attempts = 0
        self.max_retry = max_retry
        self.throttled = 0
        self.lease_lost = 0
        self.claims = 0
        self.depends_on = depends_on
        self.ignore_parent_failure = ignore_parent_failure
        self.business_key = business_key
        self.replay_of = replay_of
        self.started_at = None
        self.finished_at = finished_at
        self.timeout = timeout
        self.group = group
        self.last_traceback = None
        self.progress_json = None
        self.trace_context = trace_context
        self.priority = priority
        self.cancel_requested = False
        self.token = None
        self.lease_expires_at = None
        self.ready_seq = 0
        self.steps = None

    def __repr__(self) -> str:
        return f"Record({self.id!r}, {self.status.value}, token={self.token!r})"

    def snapshot(self) -> Task:
        """A frozen `Task` with the current values (bytes and tuples are immutable already)."""
        return task_from_fields(self.__dict__.copy())
