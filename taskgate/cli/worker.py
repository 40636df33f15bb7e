"""`taskgate worker MODULE:GATE`: run an application's gate until SIGTERM or SIGINT.

A signal stops it the way `Gate.shutdown` does: no more claims, running handlers get
``--shutdown-timeout`` seconds to finish, then are cancelled and their tasks put back exactly
as they were (no retry spent), as are claimed tasks whose handlers never started. The process
then exits 0 -- what a container runtime expects from a stop.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
from collections.abc import AsyncIterator

import anyio

from taskgate.gate import Gate

__all__ = ["serve"]

log = logging.getLogger("taskgate.cli")


async def serve(gate: Gate, shutdown_timeout: float | None, queues: list[str] | None = None) -> None:
    """Run ``gate``'s workers (of ``queues`` only, when given) until a SIGTERM or SIGINT, then
    shut them down gracefully."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as group:
            await group.start(functools.partial(gate.run, queues=queues))
            print(f"taskgate worker: running (grace {_grace(shutdown_timeout)})", file=sys.stderr, flush=True)
            group.start_soon(_stop_on_signal, gate, signals, shutdown_timeout)


async def _stop_on_signal(gate: Gate, signals: AsyncIterator[int], shutdown_timeout: float | None) -> None:
    async for signum in signals:
        log.info("%s: stopping (grace %s)", signal.Signals(signum).name, _grace(shutdown_timeout))
        break
    await gate.shutdown(shutdown_timeout)


def _grace(seconds: float | None) -> str:
    return "unlimited" if seconds is None else f"{seconds:g}s"
