"""The mutable record the memory broker keeps per task, and its frozen snapshot."""

from __future__ import annotations

from datetime import datetime

from taskgate.task import Status, Task, task_from_fields

__all__ = ["Record"]


class Record:
    """One execution as stored; only the broker touches it, callers get `snapshot` copies.

    The task's own fields live in the instance ``__dict__`` -- exactly `taskgate.task.TASK_FIELDS`
    -- and the broker's bookkeeping in slots, so a snapshot is one copy of that dict (a
    snapshot is made per task per transition: claims and acks are the memory broker's hot path).
    """

    __slots__ = ("__dict__", "lease_expires_at", "ready_seq", "token")

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
    cancel_requested: bool
    # The lease's token and end while running; None otherwise.
    token: str | None
    lease_expires_at: datetime | None
    # Bumped each time the task enters a ready heap; older heap entries are then stale.
    ready_seq: int

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
        last_error: str | None = None,
        finished_at: datetime | None = None,
    ) -> None:
        self.__dict__ = {
            "id": id,
            "type": type,
            "queue": queue,
            "payload": payload,
            "status": status,
            "created_at": created_at,
            "run_at": run_at,
            "result": None,
            "last_error": last_error,
            "attempts": 0,
            "max_retry": max_retry,
            "throttled": 0,
            "lease_lost": 0,
            "claims": 0,
            "depends_on": depends_on,
            "ignore_parent_failure": ignore_parent_failure,
            "business_key": business_key,
            "replay_of": replay_of,
            "started_at": None,
            "finished_at": finished_at,
            "cancel_requested": False,
        }
        self.token = None
        self.lease_expires_at = None
        self.ready_seq = 0

    def __repr__(self) -> str:
        return f"Record({self.id!r}, {self.status.value}, token={self.token!r})"

    def snapshot(self) -> Task:
        """A frozen `Task` with the current values (bytes and tuples are immutable already)."""
        return task_from_fields(self.__dict__.copy())
