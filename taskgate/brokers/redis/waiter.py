"""`wait_for_work` over Redis: BLPOP on the queues' signal lists, in short slices.

Every script that makes a task ready (enqueue, retry, requeue, reap, a woken child) pushes a
token onto ``signal:<queue>``, capped at a few entries. A waiter BLPOPs those lists on its own
connection, in slices of `SLICE` seconds so that `close` (which cannot interrupt a blocked
socket) is noticed within one slice. It also wakes when the earliest delayed task of its
queues falls due, measured once when the wait begins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from taskgate.brokers.redis.keys import KeySpace
from taskgate.brokers.redis.scripts import redis_errors

__all__ = ["SLICE", "SignalWaiter"]

# Longest single BLPOP, in seconds: the latency of `close` waking a waiter.
SLICE = 0.25
# BLPOP treats 0 as "forever" and rounds to milliseconds; never ask for less than this.
_MIN_BLOCK = 0.01

Runner = Callable[[str, Sequence[Any]], list[Any]]


class SignalWaiter:
    """Blocks until a queue is signalled, its earliest delayed task is due, or timeout/close."""

    def __init__(self, client: Any, keys: KeySpace, run: Runner) -> None:
        self._client = client
        self._keys = keys
        self._run = run
        self._closed = threading.Event()

    def close(self) -> None:
        """Make every current and later wait return False within one slice."""
        self._closed.set()

    def wait(self, queues: Sequence[str], timeout: float) -> bool:
        """True when woken by a signal or a task falling due; False on timeout or close."""
        if self._closed.is_set():
            return False
        deadline = time.monotonic() + timeout
        if not queues:
            self._closed.wait(timeout)
            return False
        due = self._due_monotonic(queues)
        wake_at = deadline if due is None else min(deadline, due)
        signals = [self._keys.signal(q) for q in queues]
        while not self._closed.is_set():
            remaining = wake_at - time.monotonic()
            if remaining <= 0:
                return wake_at < deadline
            if self._pop(signals, max(_MIN_BLOCK, min(SLICE, remaining))):
                return True
        return False

    def _pop(self, signals: list[str], seconds: float) -> bool:
        with redis_errors("wait_for_work"):
            return self._client.blpop(signals, timeout=seconds) is not None

    def _due_monotonic(self, queues: Sequence[str]) -> float | None:
        """When, on ``time.monotonic``, the earliest not-yet-due ready task becomes due."""
        now_us, earliest_us = self._run("next_due", list(queues))
        if not earliest_us or int(earliest_us) <= int(now_us):
            return None
        return time.monotonic() + (int(earliest_us) - int(now_us)) / 1_000_000
