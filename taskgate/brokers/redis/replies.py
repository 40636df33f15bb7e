"""Reading script replies: ``{"ok", …}`` gives the rest, an error code raises its taskgate error.

Scripts check before they write, so an error reply always means nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from taskgate.errors import (
    AlreadyFinalError,
    AlreadyReplayedError,
    BrokerError,
    CompletedNotAllowedError,
    LeaseLostError,
    QueueFullError,
    ReplayNotFinalError,
    TaskExistsError,
    TaskNotFoundError,
)
from taskgate.task import Status

__all__ = ["unwrap"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _not_found(args: Sequence[str]) -> Exception:
    return TaskNotFoundError(f"no task with id {args[0]!r}")


def _lease_lost(args: Sequence[str]) -> Exception:
    task_id, status = args
    if status == "running":
        return LeaseLostError(f"task {task_id} is held under another lease")
    return LeaseLostError(f"task {task_id} is {status}; the lease is gone")


def _full(args: Sequence[str]) -> Exception:
    queue, limit, waiting, adding = args
    return QueueFullError(queue, int(limit), int(waiting), int(adding))


def _exists(args: Sequence[str]) -> Exception:
    key, newest, status = args
    return TaskExistsError(key, newest, Status(status))


_ERRORS: dict[str, Callable[[Sequence[str]], Exception]] = {
    "notfound": _not_found,
    "leaselost": _lease_lost,
    "exists": _exists,
    "full": _full,
    "duplicate": lambda a: ValueError(f"task id {a[0]!r} is already in use"),
    "dupkey": lambda a: ValueError(f"business_key {a[0]!r} appears twice in one enqueue batch"),
    "final": lambda a: AlreadyFinalError(f"task {a[0]} is already {a[1]}"),
    "notfinal": lambda a: ReplayNotFinalError(f"execution {a[0]} is {a[1]}, not final"),
    "replayed": lambda a: AlreadyReplayedError(f"execution {a[0]} was already replayed by {a[1]}"),
    "completed": lambda a: CompletedNotAllowedError(f"execution {a[0]} completed; pass allow_completed=True"),
    "order": lambda a: ValueError(f"Replay.descendants lists {a[0]}'s execution before a parent of it"),
}


def unwrap(reply: Sequence[Any]) -> list[Any]:
    """The values after ``"ok"``; raise the taskgate error an error reply names."""
    code = _text(reply[0])
    if code == "ok":
        return list(reply[1:])
    make = _ERRORS.get(code)
    if make is None:
        raise BrokerError(f"unexpected reply from a taskgate script: {reply!r}")
    raise make([_text(v) for v in reply[1:]])
