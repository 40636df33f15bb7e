"""Backoff after a business failure by default: ``min(2**n s, 10 min)`` with +/- 20 % jitter
(`taskgate.Backoff()`), and the exponential pause of the runtime's own retries (`exponential`).

Pure functions with an injectable random source, so tests pin the window exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from taskgate.backoff import Backoff

__all__ = ["BACKOFF_CAP", "JITTER", "backoff_bounds", "business_backoff", "exponential"]

BACKOFF_CAP = 600.0
JITTER = 0.2


def exponential(n: int, *, base: float = 1.0, cap: float = BACKOFF_CAP) -> float:
    """``min(base * 2**n, cap)`` seconds; ``n`` below 0 counts as 0 (no overflow for big ``n``)."""
    n = max(0, n)
    if n >= 64:
        return cap
    return float(min(base * (2**n), cap))


# The default `Backoff`, spelled out: the formula of this module's docstring.
_DEFAULT = Backoff(base=1.0, factor=2, max=BACKOFF_CAP, jitter=JITTER)


def backoff_bounds(attempts: int) -> tuple[float, float]:
    """The jitter window ``(low, high)`` in seconds of the retry after failure number ``attempts``."""
    return _DEFAULT.bounds(attempts)


def business_backoff(attempts: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait before retry number ``attempts`` (>= 1): 2 s, 4 s, 8 s, ... capped at 10 min.

    ``rand`` returns a float in ``[0, 1)`` and places the result inside `backoff_bounds`.
    """
    return _DEFAULT.delay(attempts, rand)
