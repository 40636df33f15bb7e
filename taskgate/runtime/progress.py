"""`set_progress`: a running handler's progress, stored on its task for any process to read.

The value is encoded as compact ASCII JSON (so every backend stores it as it is) and written
with a heartbeat of the handler's lease (`Heartbeat.progress`): one broker call, checked
against the lease token like any write of the holder, which also renews the lease. Nothing is
sent for a value that cannot be stored: too large, or not JSON.
"""

from __future__ import annotations

import json
from typing import Any

import anyio.from_thread

from taskgate.brokers.params import MAX_PROGRESS_BYTES
from taskgate.runtime.context import current_context

__all__ = ["encode_progress", "set_progress", "set_progress_sync"]


def encode_progress(value: Any) -> str:
    """``value`` as the JSON text `Task.progress` decodes; `TypeError` for a value JSON cannot
    encode, `ValueError` for one longer than 64 KiB (or NaN/infinity) -- each naming it."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        kind = TypeError if isinstance(exc, TypeError) else ValueError
        raise kind(f"set_progress takes a JSON-encodable value: {exc}") from None
    if len(text) > MAX_PROGRESS_BYTES:
        raise ValueError(f"progress is {len(text)} bytes of JSON; at most {MAX_PROGRESS_BYTES} allowed")
    return text


async def set_progress(value: Any) -> None:
    """Store ``value`` (JSON, at most 64 KiB encoded) as the running task's progress, read as
    `Task.progress` from any process; renews the lease too.

    Raises `NoTaskError` outside a handler; `TypeError`/`ValueError` for a value that is not
    JSON or too large (nothing stored); like `renew_lease`, `TaskCanceledError` when the task
    was canceled, `LeaseLostError` when its lease was lost, `BrokerError` when the broker
    cannot be reached in time.
    """
    ctx = current_context("set_progress()")
    await ctx.renew(progress=encode_progress(value))


def set_progress_sync(value: Any) -> None:
    """`set_progress` for plain ``def`` handlers, which run in a worker thread; same errors."""
    ctx = current_context("set_progress_sync()")
    text = encode_progress(value)
    anyio.from_thread.run(lambda: ctx.renew(progress=text))
