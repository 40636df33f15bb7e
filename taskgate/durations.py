"""Duration parsing: timedelta, seconds, or strings such as "60s", "10m", "1h30m", "250ms"."""

from __future__ import annotations

import math
import re
from datetime import timedelta

__all__ = ["DurationLike", "parse_duration"]

DurationLike = timedelta | int | float | str

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: DurationLike, *, field: str) -> timedelta:
    """Turn ``value`` into a timedelta; raise `ValueError` naming ``field`` when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a duration, got {value!r}")
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"{field}: duration must be finite, got {value!r}")
        return _seconds(value, field)
    if isinstance(value, str):
        return _parse_text(value.strip(), field)
    raise ValueError(f"{field}: expected a duration (timedelta, seconds or '10m'), got {value!r}")


def _parse_text(text: str, field: str) -> timedelta:
    negative = text.startswith("-")
    body = text[1:] if negative else text
    if body and _is_plain_number(body):
        seconds = float(body)
    else:
        parts = _PART.findall(body)
        if not parts or "".join(n + u for n, u in parts) != body:
            raise ValueError(f"{field}: cannot read {text!r} as a duration (use e.g. '60s', '10m', '1h30m')")
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    return _seconds(-seconds if negative else seconds, field)


def _seconds(value: float, field: str) -> timedelta:
    try:
        return timedelta(seconds=value)
    except OverflowError:
        raise ValueError(f"{field}: duration {value!r} s is out of range") from None


def _is_plain_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return math.isfinite(float(text))
