"""Execution ids: ULIDs, sortable by creation time and unique across processes."""

from __future__ import annotations

import os
import threading
import time

__all__ = ["MAX_ID_LENGTH", "new_id", "new_tokens"]

# Every id, type, queue and key must fit MySQL's indexed VARCHAR(255).
MAX_ID_LENGTH = 255

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [high + low for high in _CROCKFORD for low in _CROCKFORD]  # 10 bits -> two digits
_SHIFTS = tuple(range(120, -1, -10))
_lock = threading.Lock()
_last_ms = -1
_last_rand = 0


def encode_ulid(ms: int, rand: int) -> str:
    """The 26 Crockford base-32 digits of the 128-bit ULID (48-bit ``ms``, 80-bit ``rand``).

    130 bits read as 13 groups of 10 bits, each looked up as a pair of digits (ids are made
    per task, so this is on the submit path).
    """
    value = (ms << 80) | rand
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])


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
        rand &= (1 << 80) - 1
        _last_ms, _last_rand = ms, rand
    return encode_ulid(ms, rand)


def new_tokens(n: int) -> list[str]:
    """``n`` lease tokens, each 128 random bits as 32 hex digits (like ``secrets.token_hex(16)``).

    One ``os.urandom`` call for the whole batch: a claim needs a token per task, and a system
    call each costs more than the rest of an in-memory claim.
    """
    digits = os.urandom(16 * n).hex()
    return [digits[i : i + 32] for i in range(0, 32 * n, 32)]
