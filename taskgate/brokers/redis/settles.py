"""A `Settle` as one script call: its script, its arguments, and its reply as the items' answers.

Completions alone run ``ack_many.lua`` (four values an item, the path every worker's acks
take); anything else -- a retry, fail, requeue or canceled run among the items, or capacity
given back -- runs ``settle.lua``, which gives the quota units and slots back and ends each
item as it would end alone: one ``FCALL``, so one unit and one round trip for any mix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from taskgate.brokers.params import Complete, Fail, Finish, GiveBack, ItemAnswer, Requeue, Retry, Settle
from taskgate.brokers.redis.acks import ack_args, quiet_answer, snapshot_answer
from taskgate.brokers.redis.codec import to_us, ttl_us
from taskgate.brokers.redis.replies import unwrap
from taskgate.ids import new_id

__all__ = ["settle_call"]

Answers = Callable[[list[Any]], list[ItemAnswer]]


def settle_call(settle: Settle) -> tuple[str | None, list[Any], Answers]:
    """The call of ``settle``: the script (None when there is nothing to write), its arguments
    after "now", and the items' answers from the script's whole reply."""
    mode = "snapshots" if settle.snapshots else "quiet"
    each = snapshot_answer if settle.snapshots else quiet_answer

    def answer(reply: list[Any]) -> list[ItemAnswer]:
        return [each(item) for item in unwrap(reply)] if reply else []

    give_back = _giving_back(settle.give_back)
    acks = [item for item in settle.items if isinstance(item, Complete)]
    if give_back is None and len(acks) == len(settle.items):
        return ("ack_many" if acks else None), ack_args(mode, acks), answer
    args: list[Any] = [mode, *_give_back_args(give_back), len(settle.items)]
    for item in settle.items:
        args.extend(_item_args(item))
    return "settle", args, answer


def _item_args(item: Finish) -> tuple[Any, ...]:
    """One item as ``settle.lua`` reads it: its kind, then that kind's values."""
    if isinstance(item, Complete):
        result = item.result
        return ("complete", item.task_id, item.token, 0 if result is None else 1, result or b"")
    if isinstance(item, Retry):
        hold = 1 if item.hold_queue else 0
        delay = ttl_us(item.delay)
        return ("retry", item.task_id, item.token, item.kind.value, item.error, delay, hold, *_tb(item))
    if isinstance(item, Fail):
        return (
            "fail",
            item.task_id,
            item.token,
            item.kind.value,
            item.error,
            *_tb(item),
            *_compensation(item),
        )
    if isinstance(item, Requeue):
        return ("requeue", item.task_id, item.token)
    return ("canceled", item.task_id, item.token)  # Canceled


def _tb(item: Retry | Fail) -> tuple[int, str]:
    """An item's traceback as ``settle.lua`` reads it: whether it has one, and its text."""
    return (0, "") if item.traceback is None else (1, item.traceback)


def _compensation(item: Fail) -> tuple[str, str, str, int]:
    """A fail item's compensation as ``settle.lua`` reads it: a fresh id ("" for none), type,
    queue, max_retry."""
    comp = item.compensation
    return ("", "", "", 0) if comp is None else (new_id(), comp.type, comp.queue, comp.max_retry)


def _giving_back(give_back: GiveBack | None) -> GiveBack | None:
    """``give_back`` when it gives anything back (a unit or a slot), else None."""
    if give_back is None or (not give_back.slots and not any(n for _, n in give_back.quota)):
        return None
    return give_back


def _give_back_args(give_back: GiveBack | None) -> list[Any]:
    """What ``settle.lua`` gives back: the quota groups, then the slots' queue and tokens."""
    if give_back is None:
        return [0, "", 0]
    units = [(grant, n) for grant, n in give_back.quota if n]
    args: list[Any] = [len(units)]
    for grant, n in units:
        args.extend((grant.key, to_us(grant.window_start), n))
    args.extend((give_back.queue or "", len(give_back.slots), *give_back.slots))
    return args
