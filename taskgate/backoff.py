"""`Backoff`: how long a task waits before its next try after a business failure.

The default, ``Backoff()``, is taskgate's own formula: ``min(2**n s, 10 min) ± 20 %`` before
the retry after failure ``n``. A handler (``gate.handle(..., backoff=...)``) or a queue
(``QueueConfig(backoff=...)``) can set another.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from taskgate.durations import DurationLike, parse_duration
from taskgate.errors import ConfigError

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Wait ``min(base * factor**n, max)`` seconds, ± ``jitter`` of it, before the retry after
    failure number ``n`` (1 for the first): with the defaults 2 s, 4 s, 8 s, … up to 10 min.

    ``base`` and ``max`` are durations (a timedelta, seconds, or text like ``"1s"``, ``"10m"``),
    both > 0; ``factor`` > 0 (1: the same wait every time); ``jitter`` in [0, 1) spreads each
    wait uniformly over ``[w * (1 - jitter), w * (1 + jitter))`` so failed tasks do not all
    come back at once. A bad value raises `ConfigError` naming it. ``base`` and ``max`` read
    back as timedeltas.
    """

    base: DurationLike = "1s"
    factor: float = 2
    max: DurationLike = "10m"
    jitter: float = 0.2

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", _positive_duration("base", self.base))
        object.__setattr__(self, "max", _positive_duration("max", self.max))
        factor = _finite_number("factor", self.factor)
        if factor <= 0:
            raise ConfigError(f"Backoff.factor must be > 0, got {self.factor!r}")
        jitter = _finite_number("jitter", self.jitter)
        if not 0 <= jitter < 1:
            raise ConfigError(f"Backoff.jitter must be in [0, 1), got {self.jitter!r}")

    def bounds(self, failures: int) -> tuple[float, float]:
        """The window ``(low, high)`` in seconds of the wait after failure number ``failures``."""
        center = self._center(failures)
        return center * (1 - self.jitter), center * (1 + self.jitter)

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failure number ``failures`` (>= 1); ``rand`` returns a float in
        [0, 1) placing it inside `bounds`."""
        low, high = self.bounds(failures)
        return low + (high - low) * rand()

    def _center(self, failures: int) -> float:
        base, cap = _seconds(self.base), _seconds(self.max)
        n = max(0, failures)
        try:
            grown = base * float(self.factor) ** n
        except OverflowError:  # a big factor to a big power: past any cap
            return cap
        return min(grown, cap)


def _positive_duration(field: str, value: object) -> timedelta:
    try:
        parsed = parse_duration(value, field=f"Backoff.{field}")  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if parsed <= timedelta(0):
        raise ConfigError(f"Backoff.{field} must be > 0, got {value!r}")
    return parsed


def _finite_number(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"Backoff.{field} must be a finite number, got {value!r}")
    return float(value)


def _seconds(value: DurationLike) -> float:
    assert isinstance(value, timedelta)  # parsed in __post_init__
    return value.total_seconds()
