"""`Retention`: how long final tasks are kept before the reaper deletes them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import cast

from taskgate.brokers.base import MAX_DELAY
from taskgate.durations import DurationLike, parse_duration
from taskgate.errors import ConfigError
from taskgate.task import Status

__all__ = ["Retention"]

_FIELDS = ("completed", "canceled", "failed")


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a final task is kept after it finished, per final status, before the reaper
    deletes it (with its edges and index entries; its business key is free again once all its
    executions are gone).

    Each is a duration (``"7d"``, ``"12h"``, seconds, a timedelta; 0 deletes at the next pass)
    or None: kept forever. Stored as timedelta. A negative value, or one that is not a
    duration, raises `ConfigError` naming the field. Defaults: completed and canceled 7 days,
    failed 30 days (they hold the errors an operator reads).
    """

    completed: DurationLike | None = "7d"
    canceled: DurationLike | None = "7d"
    failed: DurationLike | None = "30d"

    def __post_init__(self) -> None:
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _kept_for(name, value))

    def keep(self, status: Status) -> timedelta | None:
        """How long a task final in ``status`` is kept (None: forever)."""
        return cast("timedelta | None", getattr(self, status.value))

    @classmethod
    def from_mapping(cls, data: object, *, where: str = "retention") -> Retention:
        """Build from a mapping with the keys ``completed``, ``canceled``, ``failed``."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}: {data!r}")
        unknown = sorted(str(k) for k in data if k not in _FIELDS)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {list(_FIELDS)}")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def _kept_for(name: str, value: object) -> timedelta:
    field = f"Retention.{name}"
    try:
        kept = parse_duration(value, field=field)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(f"{exc} (None keeps such tasks forever)") from None
    if kept < timedelta(0):
        raise ConfigError(f"{field} must be >= 0 (None keeps such tasks forever), got {value!r}")
    if kept > MAX_DELAY:
        raise ConfigError(f"{field} must be at most {MAX_DELAY.days} days, got {value!r}")
    return kept
