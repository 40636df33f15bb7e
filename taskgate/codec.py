"""Payload and result encoding: bytes stay bytes, None stays None, everything else is JSON."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["encode_value"]


def encode_value(value: Any, *, what: str = "payload") -> bytes | None:
    """Encode ``value`` for storage; raise `TypeError` naming ``what`` when JSON cannot hold it."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} must be bytes, None or JSON-serialisable; got {type(value).__name__}: {exc}"
        ) from None
