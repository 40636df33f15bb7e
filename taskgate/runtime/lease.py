"""Keeping a lease alive while its handler runs, and fencing the handler when that fails.

With automatic heartbeats the keeper renews every ``lease_ttl/3``. Either way it watches the
local lease deadline (counted from before the claim or the last successful renewal, so it is
never later than the broker's): if the lease cannot be renewed before that deadline, the
handler is cancelled and its result discarded -- the worker fences itself instead of waiting
for a reaper to tell it that someone else may already hold the task.
"""

from __future__ import annotations

import logging

import anyio

from taskgate.errors import BrokerError, LeaseLostError, TaskCanceledError
from taskgate.runtime.context import RunContext
from taskgate.runtime.outcome import StopReason

__all__ = ["FENCE_MARGIN", "keep_lease"]

log = logging.getLogger("taskgate")

# Fence this fraction of the TTL before the local deadline: room for the cancellation to land
# and for the broker's clock to run a little faster than ours.
FENCE_MARGIN = 0.05


async def keep_lease(ctx: RunContext, *, auto: bool) -> None:
    """Renew ``ctx``'s lease (when ``auto``) and fence its handler at the deadline; runs until cancelled."""
    ttl = ctx.ttl.total_seconds()
    interval, margin = ttl / 3, ttl * FENCE_MARGIN
    next_renewal = anyio.current_time() + interval
    while ctx.stop_reason is None:
        fence_at = ctx.lease_deadline - margin
        wake_at = min(next_renewal, fence_at) if auto else fence_at
        await anyio.sleep(max(0.0, wake_at - anyio.current_time()))
        now = anyio.current_time()
        if now >= ctx.lease_deadline - margin:
            _fence(ctx)
            return
        if auto and now >= next_renewal:
            next_renewal = await _renew_once(ctx, interval, ctx.lease_deadline - margin)


async def _renew_once(ctx: RunContext, interval: float, fence_at: float) -> float:
    """One automatic renewal; returns when the next one is due (sooner after a failure)."""
    started = anyio.current_time()
    with anyio.move_on_after(max(0.0, fence_at - started)):
        try:
            await ctx.renew()
        except (LeaseLostError, TaskCanceledError):
            return started + interval
        except BrokerError as exc:
            log.warning(
                "task %s: heartbeat failed (will retry until the lease deadline): %s", ctx.task.id, exc
            )
            return anyio.current_time() + interval / 4
        return started + interval
    return anyio.current_time()


def _fence(ctx: RunContext) -> None:
    if ctx.stop_reason is None:
        log.warning(
            "task %s: lease could not be renewed before its deadline; cancelling the handler "
            "and discarding its result",
            ctx.task.id,
        )
    ctx.stop(StopReason.LEASE_LOST)
