"""`make_task`: a `Task` snapshot built by hand, for calling a handler directly in a unit test."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from taskgate.codec import encode_value
from taskgate.ids import new_id
from taskgate.task import Status, Task

__all__ = ["make_task"]

_FIELDS = frozenset(field.name for field in dataclasses.fields(Task))


def make_task(**fields: Any) -> Task:
    """A `Task` as a handler sees it when it starts: running, claimed once, no attempts yet.

    Every `Task` field may be given; the rest default to a fresh ``id``, ``type="task"``,
    ``queue="default"``, and now (UTC) for ``created_at``, ``run_at`` and ``started_at``.
    ``payload`` and ``result`` are encoded like a submit's payload (bytes as-is, None stays
    None, anything else JSON), so ``make_task(payload={"q": 1}).json() == {"q": 1}``. An
    unknown field raises `TypeError` naming it; a payload JSON cannot hold, `TypeError`.
    """
    unknown = sorted(set(fields) - _FIELDS)
    if unknown:
        raise TypeError(f"make_task: unknown Task field(s) {', '.join(unknown)}; known: {sorted(_FIELDS)}")
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "id": new_id(),
        "type": "task",
        "queue": "default",
        "status": Status.RUNNING,
        "created_at": now,
        "run_at": now,
        "started_at": now,
        "claims": 1,
        **fields,
    }
    values["payload"] = encode_value(values.get("payload"), what="payload")
    values["result"] = encode_value(values.get("result"), what="result")
    values["status"] = Status(values["status"])
    values["depends_on"] = tuple(values.get("depends_on", ()))
    return Task(**values)
