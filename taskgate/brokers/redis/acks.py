"""Completions as ``ack_many.lua`` takes them, and its items' answers: what the settles of
acks alone and the acks a claim carries share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taskgate.brokers.params import Complete, ItemAnswer
from taskgate.brokers.redis.codec import task_from_values
from taskgate.brokers.redis.replies import unwrap
from taskgate.errors import LeaseLostError, TaskNotFoundError

__all__ = ["ack_args", "quiet_answer", "snapshot_answer"]


def ack_args(mode: str, acks: Sequence[Complete]) -> list[Any]:
    """The arguments of ``ack_many.lua`` after "now": ``mode`` ("snapshots" or "quiet"), then
    four values per completion."""
    args: list[Any] = [mode, len(acks)]
    for ack in acks:
        result = ack.result
        args.extend((ack.task_id, ack.token, 0 if result is None else 1, result or b""))
    return args


def snapshot_answer(reply: Sequence[Any]) -> ItemAnswer:
    """One item's answer with its snapshot: the task after it, or the error of that item alone."""
    try:
        (snapshot,) = unwrap(reply)
    except (LeaseLostError, TaskNotFoundError) as exc:
        return exc
    return task_from_values(snapshot)


def quiet_answer(reply: Sequence[Any]) -> ItemAnswer:
    """One item's answer without its snapshot: None when it took effect, or that item's error."""
    try:
        unwrap(reply)
    except (LeaseLostError, TaskNotFoundError) as exc:
        return exc
    return None
