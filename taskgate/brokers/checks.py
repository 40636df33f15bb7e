"""Argument checks shared by every broker: bad input fails before any change."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import timedelta

from taskgate.brokers.base import (
    MAX_DELAY,
    AckItem,
    FailureKind,
    NewTask,
    QuotaGrant,
    Unset,
    check_identifier,
    is_identifier,
)

__all__ = [
    "MAX_ERROR_LENGTH",
    "check_ack_items",
    "check_bytes",
    "check_count",
    "check_duration",
    "check_failure",
    "check_new_tasks",
    "check_queues",
    "check_quota_claim",
    "check_quota_release",
    "check_quota_request",
    "check_retry_delay",
    "check_timeout",
    "storable_error",
]

# The longest ``last_error`` stored, in characters: room for any readable message, and far
# below what every backend's column holds (MySQL's LONGTEXT, even at 4 bytes a character).
MAX_ERROR_LENGTH = 8192


def check_count(value: object, *, what: str, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (bools are refused), else TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def check_duration(value: object, *, what: str, positive: bool) -> timedelta:
    """``value`` as a timedelta that is > 0 (``positive``) or >= 0."""
    if not isinstance(value, timedelta):
        raise TypeError(f"{what} must be a timedelta, got {value!r}")
    if value < timedelta(0) or (positive and value == timedelta(0)):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{what} must be {bound}, got {value!r}")
    return value


def check_bytes(value: object, *, what: str, allow_unset: bool = False) -> bytes | Unset | None:
    """``value`` if it is bytes or None (or UNSET when allowed)."""
    if value is None or isinstance(value, bytes) or (allow_unset and isinstance(value, Unset)):
        return value
    raise TypeError(f"{what} must be bytes or None, got {type(value).__name__}")


def storable_error(text: str) -> str:
    """``text`` as a ``last_error`` every backend can store, unchanged when it already is.

    NUL (which PostgreSQL's ``text`` cannot hold) and characters UTF-8 cannot encode (lone
    surrogates, as ``os.fsdecode`` makes of a non-UTF-8 file name) become their backslash
    escapes, and a text longer than `MAX_ERROR_LENGTH` characters is cut, saying so. The
    runtime's error texts and every broker's `retry`/`fail` go through this one function.
    """
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if len(text) > MAX_ERROR_LENGTH:
        note = f" ... [cut from {len(text)} characters]"
        text = text[: MAX_ERROR_LENGTH - len(note)] + note
    return text


def check_failure(kind: object, error: object) -> tuple[FailureKind, str]:
    """A valid ``(kind, error)`` pair for `retry`/`fail`, the error made `storable_error`."""
    if not isinstance(kind, FailureKind):
        raise TypeError(f"kind must be a FailureKind, got {kind!r}")
    if not isinstance(error, str):
        raise TypeError(f"error must be a str, got {type(error).__name__}")
    return kind, storable_error(error)


def check_retry_delay(delay: object) -> timedelta:
    """A `retry` delay: a timedelta from 0 to `MAX_DELAY` (beyond, ``now + delay`` overflows)."""
    if not isinstance(delay, timedelta):
        raise TypeError(f"delay must be a timedelta, got {delay!r}")
    if not timedelta(0) <= delay <= MAX_DELAY:
        raise ValueError(f"delay must be a timedelta from 0 to {MAX_DELAY.days} days, got {delay!r}")
    return delay


def check_new_tasks(tasks: object) -> list[NewTask]:
    """``tasks`` as a list of `NewTask`, refusing a lone NewTask or other objects."""
    if isinstance(tasks, NewTask) or not isinstance(tasks, Sequence):
        raise TypeError(f"enqueue takes a sequence of NewTask, got {type(tasks).__name__}")
    items = list(tasks)
    for item in items:
        if not isinstance(item, NewTask):
            raise TypeError(f"enqueue takes NewTask items, got {type(item).__name__}")
    return items


def check_queues(queues: object) -> list[str]:
    """Queue names to wait on; a bare str is refused (it would be read as its characters)."""
    if isinstance(queues, str) or not isinstance(queues, Collection):
        raise TypeError(f"queues must be a collection of queue names, got {queues!r}")
    return [check_identifier(q, what="queue") for q in queues]


def check_timeout(timeout: object) -> float:
    """A wait timeout in seconds, >= 0."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not timeout >= 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    return float(timeout)


def check_ack_items(items: object) -> list[AckItem]:
    """``ack_many`` items as a list of ``(task_id, token, result)``, each checked like `ack`'s."""
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise TypeError(f"ack_many takes a sequence of (task_id, token, result), got {type(items).__name__}")
    checked: list[AckItem] = []
    for n, item in enumerate(items):
        if not isinstance(item, tuple) or len(item) != 3:
            raise TypeError(f"ack_many item {n} must be a (task_id, token, result) tuple, got {item!r}")
        task_id, token, result = item
        # Each message names its item, so it is built only for an item that fails: this runs per ack.
        if not is_identifier(task_id):
            check_identifier(task_id, what=f"task id of ack_many item {n}")
        if not isinstance(token, str):
            raise TypeError(f"lease token of ack_many item {n} must be a str, got {type(token).__name__}")
        if result is not None and not isinstance(result, bytes):
            check_bytes(result, what=f"result of ack_many item {n}")
        checked.append((task_id, token, result))
    return checked


def check_quota_request(key: object, limit: object, period: object, n: object) -> None:
    """Arguments of `reserve_quota`: a key, ``limit`` >= 1, ``period`` > 0, ``n`` >= 0."""
    check_identifier(key, what="quota key")
    check_count(limit, what="quota limit", minimum=1)
    check_duration(period, what="quota period", positive=True)
    check_count(n, what="quota units n", minimum=0)


def check_claim(queue: object, limit: object, lease_ttl: object) -> None:
    """Arguments of `claim`: a queue name, ``limit`` >= 1, ``lease_ttl`` > 0."""
    check_identifier(queue, what="queue")
    check_count(limit, what="claim limit", minimum=1)
    check_duration(lease_ttl, what="lease_ttl", positive=True)


def check_quota_claim(
    queue: object, limit: object, lease_ttl: object, key: object, quota_limit: object, period: object
) -> None:
    """Arguments of `claim_within_quota`: those of `claim` and of `reserve_quota`."""
    check_claim(queue, limit, lease_ttl)
    check_quota_request(key, quota_limit, period, 0)


def check_quota_release(grant: object, n: object) -> None:
    """Arguments of `release_quota`: a `QuotaGrant` and 0 <= ``n`` <= its ``granted``."""
    if not isinstance(grant, QuotaGrant):
        raise TypeError(f"grant must be a QuotaGrant, got {type(grant).__name__}")
    count = check_count(n, what="released units n", minimum=0)
    if count > grant.granted:
        raise ValueError(f"cannot release {count} units of a grant of {grant.granted}")
