"""Bulk and pipeline recovery: `Gate.cancel_many`, `Gate.replay_many`, `Gate.replay` with
``descendants=True``.

A pipeline whose stage failed has its later stages canceled (a child of a failed parent is
canceled with it). Recovering it means re-running the failed stage AND those canceled stages,
each new one waiting for the new executions of its parents: `descendants_to_rerun` walks the
canceled descendants (``Filter(parent=...)``, one read per stage) and orders them so each comes
after its parents; the broker then creates them all in one unit (`Replay.descendants`), so a
crash or a race never leaves half a pipeline re-run.

The bulk operations are a read followed by one call per task: each call is atomic on its own;
a task that moved on meanwhile (finished before its cancel, replayed by someone else) is
passed over, not an error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from taskgate.ids import new_id
from taskgate.task import FINAL_STATUSES, Filter, Status, Task

__all__ = ["WAITING_STATUSES", "descendants_to_rerun", "replay_pairs", "replay_statuses"]

ListTasks = Callable[[Filter], Awaitable[list[Task]]]

# Statuses `cancel_many` looks in when its filter names none: every one a cancel changes.
WAITING_STATUSES = (Status.BLOCKED, Status.PENDING, Status.RETRYING, Status.RUNNING)


async def descendants_to_rerun(list_tasks: ListTasks, root: str) -> list[Task]:
    """The canceled descendants of ``root`` reached through canceled tasks only, each after
    those of its parents among them (a topological order; ties by creation)."""
    found: dict[str, Task] = {}
    frontier = [root]
    while frontier:
        children: list[Task] = []
        for parent in frontier:
            children += await list_tasks(Filter(parent=parent, status=Status.CANCELED))
        frontier = []
        for child in children:
            if child.id not in found:
                found[child.id] = child
                frontier.append(child.id)
    return _after_their_parents(found, root)


def _after_their_parents(found: dict[str, Task], root: str) -> list[Task]:
    placed = {root}
    ordered: list[Task] = []
    waiting = sorted(found.values(), key=lambda t: (t.created_at, t.id))
    while waiting:
        ready = [t for t in waiting if all(p in placed or p not in found for p in t.depends_on)]
        if not ready:  # a cycle cannot be stored; kept as a guard against looping forever
            raise RuntimeError(f"the descendants of {root} depend on each other in a cycle")
        for task in ready:
            placed.add(task.id)
            ordered.append(task)
        waiting = [t for t in waiting if t.id not in placed]
    return ordered


def replay_pairs(tasks: list[Task]) -> tuple[tuple[str, str], ...]:
    """(old id, fresh new id) for each of ``tasks``, in order: `Replay.descendants`."""
    return tuple((task.id, new_id()) for task in tasks)


def replay_statuses(filter: Filter, allow_completed: bool) -> tuple[Status, ...]:
    """The statuses `Gate.replay_many` looks in: the filter's (a final one), else failed and
    canceled, and completed when ``allow_completed``; `ValueError` for one not final."""
    if filter.status is not None:
        if filter.status not in FINAL_STATUSES:
            raise ValueError(
                f"replay_many re-runs final tasks only; the filter names status {filter.status.value}"
            )
        return (filter.status,)
    return (Status.FAILED, Status.CANCELED, *((Status.COMPLETED,) if allow_completed else ()))
