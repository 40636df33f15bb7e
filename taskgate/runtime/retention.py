"""Retention in the runtime: which final tasks the reaper deletes, as a few `Prune` calls.

`retention_plan` turns a `Config` into prunes once: every queue's final tasks are kept for
their queue's `Retention` (its `QueueConfig.retention`, else the `Config`'s), and queues kept
alike share a prune, several statuses of one age too -- the defaults are two prunes (completed
and canceled after 7 days, failed after 30). Only the queues the `Config` names are pruned,
unless it has a ``default_queue``: that covers every queue, so then the queues it does not name
are pruned at its age (its own ``retention``, else the `Config`'s).

`prune_pass` runs the plan once, on the reaper's cadence: each prune deletes at most
`PRUNE_BATCH` tasks a call and at most `MAX_BATCHES` calls a pass, so a backlog of old tasks
goes in bounded steps while workers go on claiming. Several processes pruning at once skip
each other's rows (`Broker.prune` never waits for a locked task).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from taskgate.brokers.base import Broker
from taskgate.brokers.params import Prune
from taskgate.config import Config
from taskgate.retention import Retention
from taskgate.runtime.calls import BrokerCalls
from taskgate.task import Status

__all__ = ["MAX_BATCHES", "PRUNE_BATCH", "prune_pass", "retention_plan"]

PRUNE_BATCH = 500
MAX_BATCHES = 4
_FINAL = (Status.COMPLETED, Status.CANCELED, Status.FAILED)

# What one prune covers: an age, and either the queues it names or (None) every queue but the
# excluded ones.
_Scope = tuple[timedelta, tuple[str, ...] | None, tuple[str, ...]]


def retention_plan(config: Config) -> list[Prune]:
    """The prunes that keep every queue of ``config`` to its retention (empty: keep all)."""
    own = {name: queue.retention or config.retention for name, queue in config.queues.items()}
    rest = _rest(config)
    scopes: defaultdict[_Scope, list[Status]] = defaultdict(list)
    for status in _FINAL:
        for scope in _scopes_of(status, own, rest):
            scopes[scope].append(status)
    return [
        Prune(tuple(statuses), older_than=age, queues=queues, exclude_queues=excluded, limit=PRUNE_BATCH)
        for (age, queues, excluded), statuses in scopes.items()
    ]


def _rest(config: Config) -> Retention | None:
    """The retention of the queues ``config`` does not name (None: they are not pruned)."""
    if config.default_queue is None:
        return None
    return config.default_queue.retention or config.retention


def _scopes_of(status: Status, own: dict[str, Retention], rest: Retention | None) -> list[_Scope]:
    default = None if rest is None else rest.keep(status)
    differing = {name: r.keep(status) for name, r in own.items() if rest is None or r.keep(status) != default}
    by_age: defaultdict[timedelta, list[str]] = defaultdict(list)
    for name, age in differing.items():
        if age is not None:
            by_age[age].append(name)
    scopes: list[_Scope] = [(age, tuple(sorted(names)), ()) for age, names in by_age.items()]
    if default is not None:
        scopes.append((default, None, tuple(sorted(differing))))
    return scopes


async def prune_pass(calls: BrokerCalls, broker: Broker, plan: list[Prune], deadline: float) -> int:
    """Run each prune of ``plan`` until it comes back short, at most `MAX_BATCHES` times; how
    many tasks went. A broker error propagates (the reaper logs it and tries next pass)."""
    deleted = 0
    for prune in plan:
        for _ in range(MAX_BATCHES):
            went: int = await calls(broker.prune, prune, deadline=deadline)
            deleted += went
            if went < prune.limit:
                break
    return deleted
