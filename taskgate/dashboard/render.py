"""Turning stored values into text for the templates: payloads and results (JSON
pretty-printed, else text, else a bytes preview), times and durations.

The templates escape whatever these return (Jinja2 autoescape): nothing here produces markup.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from taskgate.brokers.params import HELD_INDEFINITELY

__all__ = ["Shown", "show_bytes", "show_json_text", "show_time", "show_timedelta"]

# The most characters of one value put on a page; the rest is cut with a note.
MAX_SHOWN = 64 * 1024
# The most bytes of a binary value shown as hex.
MAX_HEX = 512


@dataclass(frozen=True, slots=True)
class Shown:
    """A value as a page shows it: ``kind`` ("json", "text", "bytes" or "none"), its ``text``,
    its size in bytes, and whether ``text`` was cut."""

    kind: str
    text: str
    size: int = 0
    cut: bool = False


def show_bytes(value: bytes | None) -> Shown:
    """``value`` pretty-printed as JSON when it is JSON, else as UTF-8 text, else as hex."""
    if value is None:
        return Shown("none", "")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return _hex(value)
    pretty = _pretty_json(text)
    kind = "text" if pretty is None else "json"
    return _cut(kind, pretty if pretty is not None else text, len(value))


def show_json_text(text: str | None) -> Shown:
    """Stored JSON text (a task's progress) pretty-printed; text that is not JSON as it is."""
    if text is None:
        return Shown("none", "")
    pretty = _pretty_json(text)
    return _cut("json" if pretty is not None else "text", pretty or text, len(text.encode("utf-8")))


def _pretty_json(text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return json.dumps(value, indent=2, ensure_ascii=False)


def _cut(kind: str, text: str, size: int) -> Shown:
    if len(text) <= MAX_SHOWN:
        return Shown(kind, text, size)
    return Shown(kind, text[:MAX_SHOWN], size, cut=True)


def _hex(value: bytes) -> Shown:
    head = value[:MAX_HEX]
    lines = [head[i : i + 16].hex(" ") for i in range(0, len(head), 16)]
    return Shown("bytes", "\n".join(lines), len(value), cut=len(value) > MAX_HEX)


def show_time(value: datetime | None) -> str:
    """A stored time as ``YYYY-MM-DD HH:MM:SS UTC`` ("" for None, "until resumed" for a hold
    without end)."""
    if value is None:
        return ""
    if value >= HELD_INDEFINITELY:
        return "until resumed"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def show_timedelta(value: timedelta | None) -> str:
    """A duration as ``1h2m3s`` (milliseconds when under a second; "" for None)."""
    if value is None:
        return ""
    total = value.total_seconds()
    if total < 1:
        return f"{round(total * 1000)}ms"
    hours, rest = divmod(int(total), 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{seconds}s" if seconds else ""]
    return "".join(parts) or "0s"
