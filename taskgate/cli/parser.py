"""The command line's grammar: one argparse parser with a subparser per command.

Options common to every command (``--url``, ``--prefix``, ``--app``, ``--json``) are accepted
before or after the command name. Parse errors raise `CLIError` instead of exiting with status
2, so every bad input ends the same way: one line on stderr, exit status 1.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from taskgate.cli import migration
from taskgate.cli.errors import CLIError
from taskgate.durations import parse_duration
from taskgate.task import Status

__all__ = ["build_migrate_parser", "build_parser"]

_STATUSES = [s.value for s in Status]
_FINAL = [s.value for s in Status if s.is_final]
_WAITING = [s.value for s in Status if not s.is_final]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CLIError(f"{message} (see {self.prog} --help)")


def _duration(value: str) -> str:
    try:
        parse_duration(value, field="duration")
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _names(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected queue names separated by commas, got {value!r}")
    return names


def _seconds(value: str) -> float:
    seconds = parse_duration(_duration(value), field="duration").total_seconds()
    return seconds


def _common(suppress: bool, *, reads: bool = True) -> _Parser:
    """The store options (with ``reads``: ``--app`` and ``--json`` too); on subcommands they
    default to what was given before the command name."""
    parser = _Parser(add_help=False)
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--url",
        dest="store_url",
        default=default,
        metavar="URL",
        help="the store, e.g. postgresql://user@host/db (TASKGATE_URL)",
    )
    parser.add_argument("--prefix", default=default, help="table or key prefix (TASKGATE_PREFIX)")
    if not reads:
        return parser
    parser.add_argument(
        "--app",
        default=default,
        metavar="MODULE:GATE",
        help="use the application's gate (its store and queues)",
    )
    parser.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS if suppress else False, help="print JSON"
    )
    return parser


def _filters(parser: argparse.ArgumentParser, *, statuses: list[str]) -> None:
    parser.add_argument("--status", choices=statuses)
    parser.add_argument("--type")
    parser.add_argument("--queue")
    parser.add_argument("--group")
    parser.add_argument("--limit", type=int, default=0, help="at most this many (default 0: all)")


def build_parser(prog: str = "taskgate") -> argparse.ArgumentParser:
    """The parser of ``taskgate``; ``args.command`` names the subcommand."""
    parser = _Parser(prog=prog, description="Operate a taskgate store.", parents=[_common(False)])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    common = [_common(True)]

    def add(name: str, help: str, parents: list[_Parser] = common) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help, parents=parents)

    # The worker's gate brings its own store; migrations read no tasks.
    worker = add("worker", "run an application's gate until SIGTERM or SIGINT", [])
    worker.add_argument("gate", metavar="MODULE:GATE", help="where the gate is, e.g. myapp.tasks:gate")
    worker.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="grace for running handlers on a stop, then they go back untouched (default 30s)",
    )
    worker.add_argument(
        "--queues",
        type=_names,
        metavar="A,B",
        help="claim from these queues only (default: every queue the app has handlers for)",
    )
    worker.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio", help="event loop")
    worker.add_argument(
        "--log-level", default="INFO", help="level of taskgate's logs on stderr (default INFO)"
    )

    stats = add("stats", "queues' backlog and holds (with --app: limits and quota too)")
    stats.add_argument("queues", nargs="*", metavar="QUEUE", help="default: the --app's configured queues")
    add("overview", "task counts by type and status")
    listing = add("list", "tasks, oldest first")
    _filters(listing, statuses=_STATUSES)
    listing.add_argument("--key", help="business key")
    listing.add_argument("--offset", type=int, default=0)
    add("show", "one task: payload, result, error, traceback, parents, children").add_argument("id")
    cancel = add("cancel", "cancel tasks (by id, or every one a filter matches) and their descendants")
    cancel.add_argument("ids", nargs="*", metavar="ID")
    _filters(cancel, statuses=_WAITING)
    replay = add("replay", "re-run a final task (or the final tasks a filter matches) as a new execution")
    replay.add_argument("id", nargs="?")
    _filters(replay, statuses=_FINAL)
    replay.add_argument("--allow-completed", action="store_true", help="replay a completed task too")
    replay.add_argument(
        "--descendants",
        action="store_true",
        help="also re-run the stages its failure canceled (always, by filter)",
    )
    purge = add("purge", "delete final tasks now")
    _filters(purge, statuses=_FINAL)
    purge.add_argument("--older-than", type=_duration, metavar="DURATION", help="e.g. 7d, 12h")
    pause = add("pause", "hold a queue in every process")
    pause.add_argument("queue")
    pause.add_argument(
        "--for", dest="for_", type=_duration, metavar="DURATION", help="default: until resumed"
    )
    add("resume", "end a queue's hold").add_argument("queue")
    site = add("dashboard", "serve the dashboard (extra taskgate[dashboard])")
    site.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    site.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    site.add_argument(
        "--allow-actions", action="store_true", help="cancel, replay, pause, resume, purge from the pages"
    )
    store_only = [_common(True, reads=False)]
    migrate = add("migrate", "run taskgate's schema migrations (SQL stores)", store_only)
    migration.add_arguments(migrate, url_required=False, parents=store_only)
    return parser


def build_migrate_parser() -> argparse.ArgumentParser:
    """The parser of ``taskgate-migrate``: ``taskgate migrate`` taking the URL after the action."""
    parser = _Parser(prog="taskgate-migrate", description="Migrate taskgate's tables.")
    migration.add_arguments(parser, url_required=True)
    parser.set_defaults(command="migrate", store_url=None, json=False, app=None)
    return parser
