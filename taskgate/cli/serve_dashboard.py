"""`taskgate dashboard`: the dashboard (`taskgate.dashboard.app`) served by uvicorn.

It reads the store the command names (``--url``/``--prefix``), or the application's gate's
(``--app``, which also tells the overview the queues and their limits). Read-only unless
``--allow-actions``; it listens on loopback unless told otherwise, since the pages show payloads.
"""

from __future__ import annotations

import argparse
import signal
from types import FrameType

from taskgate.cli.errors import CLIError
from taskgate.cli.store import load_gate, open_store

__all__ = ["serve_dashboard"]


def serve_dashboard(args: argparse.Namespace) -> int:
    """Serve until interrupted (SIGINT or SIGTERM: uvicorn's graceful stop); exit status 0."""
    try:
        import uvicorn

        from taskgate import dashboard
    except ImportError as exc:
        raise CLIError(f"the dashboard needs its extra: pip install 'taskgate[dashboard]' ({exc})") from None
    if args.app:
        gate = load_gate(args.app)
        broker, queues = gate.config.broker, gate.config
    else:
        broker, queues = open_store(args.store_url, args.prefix), None
    # uvicorn stops gracefully on SIGINT or SIGTERM, then raises the signal again for the handler
    # it found: this one makes that a plain exit, status 0, as for `taskgate worker`.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stopped)
    try:
        site = dashboard.app(broker, allow_actions=args.allow_actions, queues=queues)
        uvicorn.run(site, host=args.host, port=args.port, log_level="warning")
    except _Stopped:
        pass
    finally:
        broker.close()
    return 0


class _Stopped(Exception):
    """The server was stopped by a signal, as it should be."""


def _stopped(signum: int, frame: FrameType | None) -> None:
    raise _Stopped
