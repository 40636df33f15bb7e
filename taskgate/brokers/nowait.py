"""Attempting a broker call on the event loop: `no_wait`, and `WouldBlock` when it would wait.

A thread hop costs more than a whole SQLite transition (100-200 µs against 50-300 µs), so a
broker whose calls are usually short local work declares ``capabilities.inline_attempts`` and
the runtime first calls it on the event loop inside `no_wait`. There the broker must not
wait for anything -- a lock held by another thread or process, a back-off sleep, a batch too
big to run between two event-loop turns: it raises `WouldBlock` instead, before it changed
anything, and the runtime runs the same call again in a worker thread.

The mark is per thread: a worker thread never sees the event loop's attempt.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["WouldBlock", "active", "no_wait"]


class WouldBlock(Exception):
    """A call attempted under `no_wait` would have to wait; it changed nothing. Run it in a thread."""


class _Mark(threading.local):
    active = False


_mark = _Mark()


@contextmanager
def no_wait() -> Iterator[None]:
    """Mark broker calls made by this thread inside the block as attempts that must not wait."""
    outer = _mark.active
    _mark.active = True
    try:
        yield
    finally:
        _mark.active = outer


def active() -> bool:
    """True inside `no_wait` on this thread: the broker must raise `WouldBlock` rather than wait."""
    return _mark.active
