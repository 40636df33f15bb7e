"""Keeping leases alive while handlers run, and fencing a handler whose lease could not be kept.

Fencing: a handler still running at its fence -- the local lease deadline minus
`FENCE_MARGIN`, counted from before the claim or the last successful renewal, so never later
than the broker's -- is cancelled and its result discarded: the worker fences itself instead
of waiting for a reaper to tell it that someone else may hold the task. The keeper fences the
leases it keeps (a renewal that failed is retried no later than the fence, where it stops the
handler); a ``manual_heartbeat`` handler's fence is its cancel scope's deadline
(`RunContext.arm_fence`), moved by each renewal.

Automatic heartbeats come from ONE `LeaseKeeper` per runtime, not one sleeping task per
handler (a task and a timer per run cost more than a short handler): it renews each
registered context every ``lease_ttl/3``, each renewal in a task of its own so a slow one
delays no other.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import OrderedDict

import anyio

from taskgate.errors import BrokerError, LeaseLostError, TaskCanceledError
from taskgate.runtime.context import FENCE_MARGIN, RunContext
from taskgate.runtime.outcome import StopReason
from taskgate.runtime.signals import Alarm

__all__ = ["FENCE_MARGIN", "LeaseKeeper", "fence", "note_fenced"]

log = logging.getLogger("taskgate")


class LeaseKeeper:
    """Renews the leases of registered contexts every ``lease_ttl/3`` until they are removed.

    Contexts with one renewal interval wait in one ordered dict in registration order, which is
    due order up to one renewal's duration (a renewed context goes to the end): a renewal may
    run that much late, far inside the fence margin. A renewal that failed retries sooner,
    from a small heap.
    """

    def __init__(self) -> None:
        self._due: dict[float, OrderedDict[RunContext, float]] = {}
        self._retries: list[tuple[float, int, RunContext]] = []
        self._order = itertools.count()
        # Only an earlier due time moves the keeper's sleep: a context due later is found
        # when it next looks, so adding one costs nothing. Contexts come and go with every
        # batch, mostly before their first renewal: bringing the alarm forward, rather than
        # waking the keeper, keeps it asleep through all of them.
        self._alarm = Alarm()

    def add(self, ctx: RunContext) -> None:
        """Start renewing ``ctx``'s lease, first one interval after it was granted."""
        ttl = ctx.ttl.total_seconds()
        interval = ttl / 3  # `_interval`, written out: this runs per handler run
        group = self._due.get(interval)
        if group is None:
            group = self._due[interval] = OrderedDict()
        ctx.kept = True
        # Counted from the grant (the local lease deadline minus the TTL), not from now: a
        # lease that waited before its handler started is renewed no later than one that did not.
        at = group[ctx] = ctx.lease_deadline - ttl + interval
        self._alarm.ring_by(at)

    def remove(self, ctx: RunContext) -> None:
        """Stop renewing ``ctx`` (its handler ended)."""
        ctx.kept = False
        group = self._due.get(_interval(ctx))
        if group is not None:
            group.pop(ctx, None)

    async def run(self) -> None:
        """Renew what falls due, forever (cancel to stop)."""
        async with anyio.create_task_group() as renewals:
            while True:
                for ctx in self._take_due(anyio.current_time()):
                    renewals.start_soon(self._renew, ctx)
                next_at = self._next_due()
                # No checkpoint between looking and sleeping: nothing is added unseen.
                await self._alarm.sleep_until(math.inf if next_at is None else next_at)

    def _take_due(self, now: float) -> list[RunContext]:
        due: list[RunContext] = []
        for group in self._due.values():
            while group:
                ctx, at = next(iter(group.items()))
                if at > now:
                    break
                group.popitem(last=False)
                due.append(ctx)
        while self._retries and self._retries[0][0] <= now:
            due.append(heapq.heappop(self._retries)[2])
        return due

    def _next_due(self) -> float | None:
        fronts = [next(iter(group.values())) for group in self._due.values() if group]
        if self._retries:
            fronts.append(self._retries[0][0])
        return min(fronts, default=None)

    async def _renew(self, ctx: RunContext) -> None:
        if ctx.stop_reason is not None or not ctx.kept:
            return
        interval = _interval(ctx)
        started = anyio.current_time()
        if started >= ctx.fence_at:
            fence(ctx)  # renewals kept failing until the fence
            return
        with anyio.move_on_after(ctx.fence_at - started):
            try:
                await ctx.renew()
            except (LeaseLostError, TaskCanceledError):
                return  # the context was stopped; nothing more to renew
            except BrokerError as exc:
                log.warning(
                    "task %s: heartbeat failed (will retry until the lease deadline): %s", ctx.task.id, exc
                )
                self._retry(ctx, min(anyio.current_time() + interval / 4, ctx.fence_at))
                return
            self._reschedule(ctx, started + interval)
            return
        fence(ctx)  # the renewal hung until the fence

    def _reschedule(self, ctx: RunContext, at: float) -> None:
        group = self._due.get(_interval(ctx))
        if group is not None and ctx.stop_reason is None and ctx.kept:
            group[ctx] = at
            self._alarm.ring_by(at)

    def _retry(self, ctx: RunContext, at: float) -> None:
        if ctx.stop_reason is None and ctx.kept:
            heapq.heappush(self._retries, (at, next(self._order), ctx))
            self._alarm.ring_by(at)


def fence(ctx: RunContext) -> None:
    """Stop ``ctx``'s handler: its lease could not be renewed before the fence."""
    _warn_fenced(ctx)
    ctx.stop(StopReason.LEASE_LOST)


def note_fenced(ctx: RunContext) -> None:
    """Record that ``ctx``'s handler was cancelled by its fence deadline (lease deadline passed)."""
    if ctx.stop_reason is None:
        _warn_fenced(ctx)
        ctx.stop_reason = StopReason.LEASE_LOST


def _warn_fenced(ctx: RunContext) -> None:
    log.warning(
        "task %s: lease could not be renewed before its deadline; cancelling the handler "
        "and discarding its result",
        ctx.task.id,
    )


def _interval(ctx: RunContext) -> float:
    return ctx.ttl.total_seconds() / 3
