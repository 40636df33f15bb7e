"""How results are shown: JSON documents for scripts, aligned tables and key/value blocks for people.

Everything shown goes through `to_json` first, so the two forms never disagree: a payload or
result holding JSON is shown decoded (``payload``/``result``), other bytes as base64
(``payload_base64``/``result_base64``); datetimes are ISO 8601 in UTC, durations seconds.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, TextIO

from taskgate.task import QueueStats, Status, Task

__all__ = [
    "dump_json",
    "overview_json",
    "print_kv",
    "print_table",
    "stats_json",
    "task_json",
    "text",
]

_FAR_FUTURE_YEAR = 9999


def text(value: Any) -> str:
    """``value`` as one table cell: empty for None, ISO time to the second, seconds for durations."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        if value.year == _FAR_FUTURE_YEAR:
            return "until resumed"
        return value.isoformat(timespec="seconds")
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(text(v) for v in value)
    return str(value)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"cannot show {type(value).__name__} as JSON")


def dump_json(document: Any, out: TextIO) -> None:
    """Write ``document`` as indented JSON and a newline."""
    out.write(json.dumps(document, indent=2, default=_plain, ensure_ascii=False) + "\n")


def _body(name: str, value: bytes | None) -> dict[str, Any]:
    if value is None:
        return {name: None}
    try:
        return {name: json.loads(value)}
    except ValueError:  # not UTF-8, or not JSON: the bytes as they are
        return {name: None, f"{name}_base64": base64.b64encode(value).decode("ascii")}


def task_json(task: Task) -> dict[str, Any]:
    """Every field of ``task``; payload, result and progress decoded (see the module docstring)."""
    document: dict[str, Any] = {}
    for field in dataclasses.fields(Task):
        name = field.name
        if name == "payload" or name == "result":
            document.update(_body(name, getattr(task, name)))
        elif name == "progress_json":
            document["progress"] = task.progress
        elif name != "cancel_requested":
            value = getattr(task, name)
            document[name] = list(value) if isinstance(value, tuple) else value
    return document


def stats_json(queue: str, stats: QueueStats, *, limits_known: bool) -> dict[str, Any]:
    """``stats`` of ``queue``; the configured limits and quota only when ``limits_known`` (an
    app's config). Never this process's own figures (``running``, ``quota_stalled``): it runs
    no workers."""
    document: dict[str, Any] = {"queue": queue, **dataclasses.asdict(stats)}
    local = ("running", "quota_stalled")
    configured = (
        "workers",
        "rps",
        "quota_limit",
        "quota_used",
        "quota_window_end",
        "quota_exhausted",
        "max_pending",
    )
    for name in local if limits_known else local + configured:
        document.pop(name)
    return document


def overview_json(counts: Mapping[str, Mapping[Status, int]]) -> dict[str, dict[str, int]]:
    """Type x status counts with every status present (0 when none), types sorted."""
    return {t: {s.value: int(counts[t].get(s, 0)) for s in Status} for t in sorted(counts)}


def print_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], out: TextIO) -> None:
    """Print ``rows`` under a header of ``columns``, each column as wide as its widest cell."""
    cells = [[text(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    for line in [list(columns), *cells]:
        out.write("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() + "\n")


def print_kv(pairs: Iterable[tuple[str, Any]], out: TextIO) -> None:
    """Print ``name: value`` lines, names aligned; a value of several lines is indented below."""
    items = list(pairs)
    width = max((len(name) for name, _ in items), default=0)
    for name, value in items:
        shown = value if isinstance(value, str) else text(value)
        if "\n" in shown:
            out.write(f"{name}:\n")
            out.writelines(f"    {line}\n" for line in shown.rstrip("\n").splitlines())
        else:
            out.write(f"{name + ':':<{width + 1}} {shown}".rstrip() + "\n")
