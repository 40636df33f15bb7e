"""The ``taskgate`` command line (also ``python -m taskgate``): run workers, inspect and operate
a store. See ``taskgate --help``; `main` is the entry point.

Layout: `parser` (the grammar), `store` (which gate a command talks to), `commands` and
`show` (what the store commands do), `worker`, `migration`, `output` (tables and JSON).
Every failure an operator can cause -- bad input, an unreachable or unmigrated store, an
unknown task -- ends with one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

import anyio

from taskgate.cli import migration
from taskgate.cli.commands import COMMANDS
from taskgate.cli.errors import CLIError, one_line
from taskgate.cli.parser import build_migrate_parser, build_parser
from taskgate.cli.serve_dashboard import serve_dashboard
from taskgate.cli.store import client_gate, load_gate, open_store
from taskgate.cli.worker import serve
from taskgate.errors import TaskgateError
from taskgate.gate import Gate

__all__ = ["main", "migrate_main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    return _run(build_parser(), argv)


def migrate_main(argv: Sequence[str] | None = None) -> int:
    """Run ``taskgate-migrate`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    return _run(build_migrate_parser(), argv)


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    prog = parser.prog
    try:
        args = parser.parse_args(argv)
        _from_environment(args)
        return _dispatch(args, sys.stdout)
    except KeyboardInterrupt:
        return 130
    except BaseExceptionGroup as group:  # the worker's task group: report one operator error as such
        exc = _only(group)
        if not isinstance(exc, _operator_errors()):
            raise
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except _operator_errors() as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1


def _only(exc: BaseException) -> BaseException:
    """The one exception inside nested groups of one (else ``exc`` itself)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _operator_errors() -> tuple[type[BaseException], ...]:
    """What bad input or a failing store raises (driver errors included, for `migrate`)."""
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    return (
        CLIError,
        TaskgateError,
        ValueError,
        TypeError,
        OSError,
        ImportError,
        SQLAlchemyError,
        CommandError,
    )


def _from_environment(args: argparse.Namespace) -> None:
    if getattr(args, "store_url", None) is None:
        args.store_url = os.environ.get("TASKGATE_URL") or None
    if getattr(args, "prefix", None) is None:
        args.prefix = os.environ.get("TASKGATE_PREFIX") or None


def _dispatch(args: argparse.Namespace, out: TextIO) -> int:
    if args.command == "migrate":
        migration.run(args, out)
        return 0
    if args.command == "worker":
        return _worker(args)
    if args.command == "dashboard":
        return serve_dashboard(args)
    # The runtime's warnings (a store not answering) would add lines to the one-line error.
    logging.getLogger("taskgate").addHandler(logging.NullHandler())
    gate = load_gate(args.app) if args.app else client_gate(open_store(args.store_url, args.prefix))
    try:
        anyio.run(COMMANDS[args.command], gate, args, out)
    finally:
        gate.config.broker.close()
    return 0


def _worker(args: argparse.Namespace) -> int:
    gate: Gate = load_gate(args.gate)
    # taskgate's own logs at --log-level; other libraries' at WARNING unless the app set up logging.
    logging.getLogger("taskgate").setLevel(args.log_level.upper())
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        anyio.run(functools.partial(serve, gate, args.shutdown_timeout, args.queues), backend=args.backend)
    finally:
        gate.config.broker.close()
    return 0
