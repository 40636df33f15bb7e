"""Argument checks shared by every broker: bad input fails before any change."""

from __future__ import annotations

from collections.abc import Collection

from taskgate.brokers.base import check_identifier

__all__ = [
    "MAX_ERROR_LENGTH",
    "MAX_TRACEBACK_BYTES",
    "check_count",
    "check_queues",
    "check_timeout",
    "storable_error",
    "storable_traceback",
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


# The longest ``last_traceback`` stored, in UTF-8 bytes: the newest frames of any readable
# traceback, and within every backend's column.
MAX_TRACEBACK_BYTES = 8192
_TRACEBACK_CUT = "[older frames cut]\n"


def storable_traceback(text: str) -> str:
    """``text`` as a ``last_traceback`` every backend can store: escaped as `storable_error`
    escapes, then, when longer than `MAX_TRACEBACK_BYTES` in UTF-8, its START cut (saying so) --
    a traceback's newest frames and the exception's own line are at its end."""
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if len(text) <= MAX_TRACEBACK_BYTES // 4:
        return text  # at most 4 bytes a character: short enough whatever it holds
    data = text.encode("utf-8")
    if len(data) <= MAX_TRACEBACK_BYTES:
        return text
    room = MAX_TRACEBACK_BYTES - len(_TRACEBACK_CUT)
    return _TRACEBACK_CUT + data[-room:].decode("utf-8", "ignore")  # "ignore": a character cut in two


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
