"""Execution ids: ULIDs, sortable by creation time and unique across processes."""

from __future__ import annotations

import functools
import os
import threading
import time

from taskgate import forks

__all__ = ["MAX_ID_LENGTH", "new_id", "new_ids", "new_tokens"]

# Every id, type, queue and key must fit MySQL's indexed VARCHAR(255).
MAX_ID_LENGTH = 255

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [high + low for high in _CROCKFORD for low in _CROCKFORD]  # 10 bits -> two digits
_SHIFTS = tuple(range(120, -1, -10))
_RANDOM_SHIFTS = tuple(range(70, -1, -10))  # the last 8 groups: exactly the 80 random bits
_BLOCK_SHIFTS = tuple(range(60, -1, -10))  # the random part without its last 10 bits
_RANDOM_BITS = (1 << 80) - 1
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
    ms, rand = _reserve(1)
    return _time_digits(ms) + "".join([_PAIRS[(rand >> shift) & 1023] for shift in _RANDOM_SHIFTS])


def new_ids(n: int) -> list[str]:
    """``n`` ULIDs in increasing order: one clock read and one random draw for the whole batch.

    Consecutive ids differ in their last two digits, mostly: the 24 digits before those are
    spelled once per 1,024 ids.
    """
    ms, first = _reserve(n)
    pairs = _PAIRS
    ids: list[str] = []
    block = first >> 10
    while len(ids) < n:
        head = _head(ms, block)
        low = (first & 1023) if not ids else 0
        high = min(1024, low + n - len(ids))
        ids.extend([head + pair for pair in pairs[low:high]])
        block += 1
    return ids


def _reserve(n: int) -> tuple[int, int]:
    """The millisecond and first random part of ``n`` consecutive ids.

    Within one millisecond the random part counts up from where the last id left it (the ULID
    spec's monotonic rule), so ids made by one process always sort in the order they were made.
    """
    global _last_ms, _last_rand
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            # Same (or a stepped-back) millisecond: continue from the last id so order is kept.
            ms = _last_ms
            first = (_last_rand + 1) & _RANDOM_BITS
        else:
            first = int.from_bytes(os.urandom(10), "big")
        if first + n - 1 > _RANDOM_BITS or (ms == _last_ms and first == 0):
            # The random part would wrap: move to the next millisecond, as the spec allows.
            ms += 1
            first = int.from_bytes(os.urandom(9), "big")
        _last_ms, _last_rand = ms, first + n - 1
    return ms, first


@functools.lru_cache(maxsize=4)
def _time_digits(ms: int) -> str:
    """The first 10 digits of a ULID: its 48-bit millisecond time (the top 2 of 130 bits are 0)."""
    return encode_ulid(ms, 0)[:10]


@functools.lru_cache(maxsize=4)
def _head(ms: int, block: int) -> str:
    """The first 24 digits of the ids of millisecond ``ms`` whose random part is in ``block``
    (all but its last 10 bits). Cached: single submits in one millisecond count up through one
    block, so they share it."""
    return _time_digits(ms) + "".join([_PAIRS[(block >> shift) & 1023] for shift in _BLOCK_SHIFTS])


class _ForkReset:
    """Resets the generator in a forked child (`taskgate.forks`): a child that went on from
    its parent's last millisecond and random part would make, in that same millisecond, the
    very ids its parent makes next."""

    def after_fork_in_child(self) -> None:
        global _lock, _last_ms, _last_rand
        _lock = threading.Lock()  # a thread of the parent may have held it at the fork
        _last_ms, _last_rand = -1, 0


_FORK_RESET = _ForkReset()  # `forks.register` keeps a weak reference: this one lives with the module
forks.register(_FORK_RESET)


def new_tokens(n: int) -> list[str]:
    """``n`` lease tokens, each 128 random bits as 32 hex digits (like ``secrets.token_hex(16)``).

    One ``os.urandom`` call for the whole batch: a claim needs a token per task, and a system
    call each costs more than the rest of an in-memory claim.
    """
    digits = os.urandom(16 * n).hex()
    return [digits[i : i + 32] for i in range(0, 32 * n, 32)]
