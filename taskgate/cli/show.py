"""`taskgate show ID`: one task with everything around it -- parents, children, replay chain.

The broker protocol reads tasks by id or by filter only, so children and later replays are
found by paging through the store's tasks, at most `SCAN_LIMIT` of them; the answer says when
it stopped short (``related_complete``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TextIO

from taskgate.cli.output import dump_json, print_kv, task_json, text
from taskgate.errors import TaskNotFoundError
from taskgate.gate import Gate
from taskgate.task import Filter, Task

__all__ = ["SCAN_LIMIT", "TaskDetail", "print_detail", "read_detail"]

SCAN_LIMIT = 10_000
_PAGE = 500
_CHAIN_LIMIT = 100


@dataclass
class TaskDetail:
    """A task and its neighbours as `read_detail` found them."""

    task: Task
    parents: list[dict[str, Any]] = field(default_factory=list)
    children: list[dict[str, Any]] = field(default_factory=list)
    replay_chain: list[str] = field(default_factory=list)
    related_complete: bool = True

    def document(self) -> dict[str, Any]:
        """The JSON form of `taskgate show --json`."""
        return {
            "task": task_json(self.task),
            "parents": self.parents,
            "children": self.children,
            "replay_chain": self.replay_chain,
            "related_complete": self.related_complete,
        }


def _brief(task: Task) -> dict[str, Any]:
    return {"id": task.id, "type": task.type, "status": task.status.value}


async def read_detail(gate: Gate, task_id: str) -> TaskDetail:
    """``task_id``'s snapshot, its parents, children and replay chain (oldest first)."""
    task = await gate.get(task_id)
    detail = TaskDetail(task)
    for parent_id in task.depends_on:
        try:
            detail.parents.append(_brief(await gate.get(parent_id)))
        except TaskNotFoundError:
            detail.parents.append({"id": parent_id, "type": None, "status": "deleted"})
    earlier = await _earlier(gate, task)
    later, detail.related_complete = await _scan(gate, task, detail)
    detail.replay_chain = [*earlier, task.id, *later]
    return detail


async def _earlier(gate: Gate, task: Task) -> list[str]:
    chain: list[str] = []
    current = task
    while current.replay_of is not None and len(chain) < _CHAIN_LIMIT:
        chain.insert(0, current.replay_of)
        try:
            current = await gate.get(current.replay_of)
        except TaskNotFoundError:
            break
    return chain


async def _scan(gate: Gate, task: Task, detail: TaskDetail) -> tuple[list[str], bool]:
    """Children and later replays of ``task``, paging through the store's tasks."""
    replays: dict[str, str] = {}
    offset = 0
    while offset < SCAN_LIMIT:
        page = await gate.list(Filter(limit=_PAGE, offset=offset))
        for other in page:
            if task.id in other.depends_on:
                detail.children.append(_brief(other))
            if other.replay_of is not None:
                replays[other.replay_of] = other.id
        if len(page) < _PAGE:
            return _follow(replays, task.id), True
        offset += _PAGE
    return _follow(replays, task.id), False


def _follow(replays: dict[str, str], start: str) -> list[str]:
    chain: list[str] = []
    current = start
    while current in replays and len(chain) < _CHAIN_LIMIT:
        current = replays[current]
        chain.append(current)
    return chain


def _pretty(value: bytes | None) -> str:
    if value is None:
        return ""
    try:
        return json.dumps(json.loads(value), indent=2, ensure_ascii=False)
    except ValueError:
        return repr(value)


def _links(items: list[dict[str, Any]]) -> str:
    return "\n".join(f"{i['id']}  {i['type'] or ''}  {i['status']}" for i in items)


def print_detail(detail: TaskDetail, out: TextIO, *, as_json: bool) -> None:
    """Show ``detail`` as JSON or as a block of ``name: value`` lines."""
    if as_json:
        dump_json(detail.document(), out)
        return
    task = detail.task
    chain = detail.replay_chain if len(detail.replay_chain) > 1 else []
    print_kv(
        [
            ("id", task.id),
            ("type", task.type),
            ("queue", task.queue),
            ("group", task.group),
            ("priority", task.priority),
            ("status", task.status),
            ("business key", task.business_key),
            ("attempts", f"{task.attempts} (max_retry {task.max_retry})"),
            ("throttled", task.throttled),
            ("lease lost", task.lease_lost),
            ("claims", task.claims),
            ("created", task.created_at),
            ("run at", task.run_at),
            ("started", task.started_at),
            ("finished", task.finished_at),
            ("timeout", task.timeout),
            ("replay of", task.replay_of),
            ("replay chain", " -> ".join(chain)),
            ("parents", _links(detail.parents)),
            (
                "children",
                _links(detail.children) + ("" if detail.related_complete else "\n(not all searched)"),
            ),
            ("progress", "" if task.progress_json is None else json.dumps(task.progress, indent=2)),
            ("payload", _pretty(task.payload)),
            ("result", _pretty(task.result)),
            ("last error", text(task.last_error)),
            ("traceback", text(task.last_traceback)),
        ],
        out,
    )
