"""Re-running a transaction that lost a race to another one: ONE helper, bounded and jittered.

Databases resolve lock cycles and write conflicts by aborting one transaction (PostgreSQL
40P01/40001, MySQL 1213/1205, SQLite "database is locked"). The transaction rolled back
entirely, so running it again from the start is safe. We try `ATTEMPTS` times in all, sleeping
a jittered ``5-10 ms, 10-20 ms, 20-40 ms, 40-80 ms`` in between (under 150 ms worst case), then
let the last error out. A unique constraint that lost a race (`Conflict`) is re-run the same
way: the transaction's own checks then see the winner and raise the documented error.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["ATTEMPTS", "Conflict", "backoff", "run_with_retries"]

ATTEMPTS = 5
_FIRST_DELAY = 0.01
_MAX_DELAY = 0.08

_T = TypeVar("_T")


class Conflict(Exception):
    """A unique constraint lost a race; re-running the transaction will explain the outcome."""


def backoff(attempt: int) -> float:
    """Seconds to sleep after failed attempt number ``attempt`` (0-based): jittered, doubling."""
    ceiling = min(_FIRST_DELAY * 2**attempt, _MAX_DELAY)
    return random.uniform(ceiling / 2, ceiling)


def run_with_retries(
    attempt: Callable[[], _T],
    retryable: Callable[[BaseException], bool],
    *,
    attempts: int = ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> _T:
    """Call ``attempt`` until it succeeds, re-running it on retryable errors at most ``attempts`` times."""
    for number in range(attempts):
        try:
            return attempt()
        except Exception as exc:
            last_try = number + 1 >= attempts
            if last_try or not (isinstance(exc, Conflict) or retryable(exc)):
                raise
            sleep(backoff(number))
    raise AssertionError("unreachable")  # pragma: no cover
