"""Backoff after a business failure: ``min(2**n s, 10 min)`` with +/- 20 % jitter.

Pure functions with an injectable random source, so tests pin the window exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["BACKOFF_CAP", "JITTER", "backoff_bounds", "business_backoff", "exponential"]

BACKOFF_CAP = 600.0
JITTER = 0.2


def exponential(n: int, *, base: float = 1.0, cap: float = BACKOFF_CAP) -> float:
    """``min(base * 2**n, cap)`` seconds; ``n`` below 0 counts as 0 (no overflow for big ``n``)."""
    n = max(0, n)
    if n >= 64:
        return cap
    return float(min(base * (2**n), cap))


def backoff_bounds(attempts: int) -> tuple[float, float]:
    """The jitter window ``(low, high)`` in seconds of the retry after failure number ``attempts``."""
    center = exponential(attempts)
    return center * (1 - JITTER), center * (1 + JITTER)


def business_backoff(attempts: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait before retry number ``attempts`` (>= 1): 2 s, 4 s, 8 s, ... capped at 10 min.

    ``rand`` returns a float in ``[0, 1)`` and places the result inside `backoff_bounds`.
    """
    low, high = backoff_bounds(attempts)
    return low + (high - low) * rand()
