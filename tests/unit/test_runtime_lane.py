"""Lane: one cancel scope per worker, reachable only by the handler running in it."""

from __future__ import annotations

import math
from datetime import timedelta

import anyio
import anyio.lowlevel
import pytest

from taskgate.brokers.base import Lease, NewTask
from taskgate.brokers.memory import MemoryBroker
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.context import Lane, RunContext
from taskgate.runtime.outcome import StopReason
from taskgate.testing import steps

pytestmark = pytest.mark.anyio

TTL = timedelta(seconds=30)


def _contexts(n: int, *, kept: bool = True) -> list[RunContext]:
    broker = MemoryBroker()
    steps.enqueue(broker, [NewTask(id=f"t{i}", type="t", queue="q") for i in range(n)])
    leases: list[Lease] = steps.claim(broker, "q", n, TTL)
    calls = BrokerCalls(1)
    return [
        RunContext(lease=lease, broker=broker, calls=calls, ttl=TTL, deadline=5.0, kept=kept)
        for lease in leases
    ]


async def test_a_stop_after_its_handler_finished_does_not_reach_the_next_handler():
    first, second = _contexts(2)
    lane = Lane()
    with lane.open():
        first.lane = second.lane = lane
        lane.start(first)
        lane.finish(first)
        first.stop(StopReason.CANCELED)  # late: the handler is done
        assert first.stop_reason is StopReason.CANCELED
        assert not lane.spent
        lane.start(second)
        await anyio.lowlevel.checkpoint()  # would raise if the scope had been cancelled
        lane.finish(second)


async def test_a_stop_while_its_handler_runs_spends_the_scope_and_a_new_one_is_fresh():
    (ctx,) = _contexts(1)
    lane = Lane()
    reached = False
    with lane.open():
        ctx.lane = lane
        lane.start(ctx)
        ctx.stop(StopReason.LEASE_LOST)
        await anyio.lowlevel.checkpoint()
        reached = True
    assert not reached and lane.spent
    with lane.open():
        assert not lane.spent
        await anyio.lowlevel.checkpoint()


async def test_a_context_stopped_before_it_starts_is_cancelled_when_it_starts():
    (ctx,) = _contexts(1)
    ctx.stop(StopReason.SHUTDOWN)
    lane = Lane()
    with lane.open():
        ctx.lane = lane
        lane.start(ctx)
        assert lane.spent


async def test_an_unkept_lease_arms_the_fence_only_while_its_handler_runs():
    (ctx,) = _contexts(1, kept=False)
    lane = Lane()
    with lane.open() as scope:
        ctx.lane = lane
        ctx.arm_fence()  # not running yet: the lane's deadline stays open
        assert scope.deadline == math.inf
        lane.start(ctx)
        assert scope.deadline == ctx.fence_at
        lane.finish(ctx)
        assert scope.deadline == math.inf
