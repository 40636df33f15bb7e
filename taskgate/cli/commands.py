"""The commands that read or change the store through a gate: stats, overview, list, show,
cancel, replay, purge, pause, resume. Each takes the gate, the parsed arguments and the output
stream, and prints JSON (``--json``) or a table."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TextIO

from taskgate.cli.errors import CLIError
from taskgate.cli.output import dump_json, overview_json, print_table, stats_json, task_json, text
from taskgate.cli.show import print_detail, read_detail
from taskgate.gate import Gate
from taskgate.task import Filter, Status

__all__ = ["COMMANDS", "Command"]

Command = Callable[[Gate, argparse.Namespace, TextIO], Awaitable[None]]

_LIST_COLUMNS = ("id", "type", "queue", "status", "attempts", "created_at", "group", "business_key")
_STATS_COLUMNS = ("queue", "queue_len", "paused_until", "unhandled")
_LIMIT_COLUMNS = ("workers", "rps", "quota_used", "quota_limit", "quota_window_end")


def _filter(args: argparse.Namespace) -> Filter:
    return Filter(
        type=args.type,
        queue=args.queue,
        status=None if args.status is None else Status(args.status),
        group=args.group,
        business_key=getattr(args, "key", None),
        limit=args.limit,
        offset=getattr(args, "offset", 0),
    )


async def stats(gate: Gate, args: argparse.Namespace, out: TextIO) -> None:
    """Each queue's backlog, hold and unhandled count; limits and quota too with ``--app``."""
    queues = args.queues or sorted(gate.config.queues)
    if not queues:
        raise CLIError("name a queue (taskgate stats QUEUE), or pass --app MODULE:GATE for its queues")
    await gate.list(Filter(limit=1))  # an unreachable store raises here, with its reason
    rows = []
    for queue in queues:
        figures = await gate.stats(queue)
        if not figures.reachable:
            raise CLIError(f"the store did not answer reading queue {queue!r}")
        rows.append(stats_json(queue, figures, limits_known=args.app is not None))
    if args.json:
        dump_json(rows, out)
    else:
        print_table(rows, _STATS_COLUMNS + (_LIMIT_COLUMNS if args.app else ()), out)


async def overview(gate: Gate, args: argparse.Namespace, out: TextIO) -> None:
    """Task counts by type and status."""
    counts = overview_json(await gate.overview())
    if args.json:
        dump_json(counts, out)
        return
    rows = [{"type": t, **per_status, "total": sum(per_status.values())} for t, per_status in counts.items()]
    print_table(rows, ("type", *(s.value for s in Status), "total"), out)


async def list_tasks(gate: Gate, args: argparse.Namespace, out: TextIO) -> None:
    """Tasks matching the filter options, oldest first."""
    tasks = await gate.list(_filter(args))
    if args.json:
        dump_json([task_json(t) for t in tasks], out)
    else:
        print_table([vars(t) for t in tasks], _LIST_COLUMNS, out)


async def show(gate: Gate, args: argparse.Namespace, out: TextIO) -> None:
    """Everything about one task."""
    print_detail(await read_detail(gate, args.id), out, as_json=args.json)


def _by_filter(args: argparse.Namespace, ids: list[str]) -> bool:
    """Whether the command names its tasks by filter options; `CLIError` unless by one way."""
    filtered = any(getattr(args, name) is not None for name in ("status", "type", "queue", "group"))
    if filtered == bool(ids):
        raise CLIError(
            f"{args.command}: give task ids or filter options (--status, --type, --queue, --group), "
            "not both" + ("" if ids else ", nor neither")
        )
    return filtered


async def cancel(gate: Gate, args: argparse.Namespace, out: TextIO) -> None:
    """Cancel each task named, or each one the filter matches (`Gate.cancel_many`), and its
    descendants.

    By id it stops at the first that cannot be canceled; by filter it passes over those.
    """
    if _by_filter(args, args.ids):
        count = await gate.cancel_many(_filter(args))
        if args.json:
            dump_json({"canceled": count}, out)
        else:
            out.write(f"canceled {count} task{'' if count == 1 else 's'}\n")
        return
    tasks = [await gate.cancel(task_id) for task_id in args.ids]
    if args.json:
        dump_json([task_json(t) for t in tasks], out)
    else:
        for task in tasks:
            shown = "cancel requested (running)" if task.status is Status.RUNNING else task.status.value
            out.write(f"{task.id}  {shown}\n")


async def replay(gate: Gate, args: argparse.Namespace, out: TextIO) -> None:
    """Re-run a final task as a new execution (with ``--descendants``, with the stages its
    failure canceled) and print the new id; or, by filter, each final task it matches that is
    the newest of its chain, with its canceled descendants (`Gate.replay_many`), printing
    each new execution and the one it re-runs."""
    if _by_filter(args, [args.id] if args.id else []):
        if args.status is None:
            raise CLIError("replay: a filter needs --status (failed, canceled, or completed)")
        if args.status == Status.COMPLETED and not args.allow_completed:
            raise CLIError("replay: completed tasks are replayed only with --allow-completed")
        made = await gate.replay_many(_filter(args), allow_completed=args.allow_completed)
        pairs = [(task.replay_of, task.id) for task in [await gate.get(new) for new in made]]
        if args.json:
            dump_json([{"id": new, "replay_of": old} for old, new in pairs], out)
        else:
            out.writelines(f"{new}  replay of {old}\n" for old, new in pairs)
        return
    new_id = await gate.replay(args.id, allow_completed=args.allow_completed, descendants=args.descendants)
    if args.json:
        dump_json({"id": new_id, "replay_of": args.id}, out)
    else:
        out.write(f"{new_id}\n")


async def purge(gate: Gate, args: argparse.Namespace, out: TextIO) -> None:
    """Delete final tasks matching the filter that finished at least ``--older-than`` ago."""
    deleted = await gate.purge(_filter(args), older_than=args.older_than)
    if args.json:
        dump_json({"purged": deleted}, out)
    else:
        out.write(f"purged {deleted} task{'' if deleted == 1 else 's'}\n")


async def pause(gate: Gate, args: argparse.Namespace, out: TextIO) -> None:
    """Hold a queue in every process, for a while or until resumed."""
    until = await gate.pause(args.queue, for_=args.for_)
    if args.json:
        dump_json({"queue": args.queue, "paused_until": until}, out)
    else:
        shown = "until resumed" if until.year == 9999 else f"until {text(until)}"
        out.write(f"paused {args.queue} {shown}\n")


async def resume(gate: Gate, args: argparse.Namespace, out: TextIO) -> None:
    """End a queue's hold."""
    await gate.resume(args.queue)
    if args.json:
        dump_json({"queue": args.queue, "paused_until": None}, out)
    else:
        out.write(f"resumed {args.queue}\n")


COMMANDS: dict[str, Command] = {
    "stats": stats,
    "overview": overview,
    "list": list_tasks,
    "show": show,
    "cancel": cancel,
    "replay": replay,
    "purge": purge,
    "pause": pause,
    "resume": resume,
}
