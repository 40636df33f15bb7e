"""Execution ids: ULIDs, sortable by creation time and unique across processes."""

from __future__ import annotations

import os
import threading
import time

__all__ = ["MAX_ID_LENGTH", "new_id"]

# Every id, type, queue and key must fit MySQL's indexed VARCHAR(255).
MAX_ID_LENGTH = 255

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_lock = threading.Lock()
_last_ms = -1
_last_rand = 0


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        chars.append(_CROCKFORD[digit])
    return "".join(reversed(chars))


def new_id() -> str:
    """A 26-character ULID; ids made by one process in the same millisecond still sort in order."""
    global _last_ms, _last_rand
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            # Same (or a stepped-back) millisecond: bump the random part so order is kept.
            ms = _last_ms
            rand = _last_rand + 1
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _last_ms, _last_rand = ms, rand & ((1 << 80) - 1)
    return _encode(ms, 10) + _encode(_last_rand, 16)
