"""The mutable record the memory broker keeps per task, and its frozen snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from taskgate.task import Status, Task, task_from_fields

__all__ = ["Record"]


@dataclass(slots=True)
class Record:
    """One execution as stored; only the broker touches it, callers get `snapshot` copies."""

    id: str
    type: str
    queue: str
    payload: bytes | None
    status: Status
    created_at: datetime
    run_at: datetime
    max_retry: int
    depends_on: tuple[str, ...]
    ignore_parent_failure: bool
    business_key: str | None
    replay_of: str | None
    result: bytes | None = None
    last_error: str | None = None
    attempts: int = 0
    throttled: int = 0
    lease_lost: int = 0
    claims: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    token: str | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False
    # Bumped each time the task enters a ready heap; older heap entries are then stale.
    ready_seq: int = 0

    def snapshot(self) -> Task:
        """A frozen `Task` with the current values (bytes and tuples are immutable already)."""
        return task_from_fields(
            {
                "id": self.id,
                "type": self.type,
                "queue": self.queue,
                "payload": self.payload,
                "status": self.status,
                "created_at": self.created_at,
                "run_at": self.run_at,
                "result": self.result,
                "last_error": self.last_error,
                "attempts": self.attempts,
                "max_retry": self.max_retry,
                "throttled": self.throttled,
                "lease_lost": self.lease_lost,
                "claims": self.claims,
                "depends_on": self.depends_on,
                "ignore_parent_failure": self.ignore_parent_failure,
                "business_key": self.business_key,
                "replay_of": self.replay_of,
                "started_at": self.started_at,
                "finished_at": self.finished_at,
                "cancel_requested": self.cancel_requested,
            }
        )
