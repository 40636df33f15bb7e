"""`taskgate cancel` and `taskgate replay` by filter instead of by id: each matching task in
turn, through the same `Gate.cancel` and `Gate.replay` calls as one id.

The tasks are listed once, then acted on one by one, so this is not one atomic unit: a task
that finished or went meanwhile, a descendant already canceled with its parent, an older
execution of a replay chain (only its newest can be replayed) are passed over, not errors.
"""

from __future__ import annotations

from taskgate.errors import AlreadyFinalError, AlreadyReplayedError, TaskNotFoundError
from taskgate.gate import Gate
from taskgate.task import Filter, Task

__all__ = ["cancel_matching", "replay_matching"]


async def cancel_matching(gate: Gate, filter: Filter) -> list[Task]:
    """Cancel every task ``filter`` matches that is not final yet; the snapshots canceled."""
    canceled: list[Task] = []
    for task in await gate.list(filter):
        if task.status.is_final:
            continue
        try:
            canceled.append(await gate.cancel(task.id))
        except (AlreadyFinalError, TaskNotFoundError):
            continue  # finished, canceled with a parent, or deleted since it was listed
    return canceled


async def replay_matching(gate: Gate, filter: Filter, *, allow_completed: bool) -> list[tuple[str, str]]:
    """Replay every final task ``filter`` matches that is the newest of its chain; the pairs
    ``(replayed id, new id)``."""
    replayed: list[tuple[str, str]] = []
    for task in await gate.list(filter):
        if not task.status.is_final:
            continue
        try:
            replayed.append((task.id, await gate.replay(task.id, allow_completed=allow_completed)))
        except (AlreadyReplayedError, TaskNotFoundError):
            continue  # an older execution of its chain, or deleted since it was listed
    return replayed
