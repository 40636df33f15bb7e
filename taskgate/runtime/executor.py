"""Running one claimed task: call its handler, keep its lease, and write the outcome.

The handler runs inside its worker's cancel scope (`Lane`), next to the lease keeper.
Whatever stopped it decides the write: the handler's own result or exception (`decide`), or
the stop reason (cancel -> ``finish_canceled``, shutdown -> ``requeue``, lease lost ->
nothing). A stopped handler's cancellation goes on up to the lane's scope, which ends it;
the write happens shielded on the way, so a runtime being cancelled still puts its tasks back.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any

import anyio

from taskgate.brokers.base import Broker
from taskgate.codec import encode_value
from taskgate.errors import BrokerError, LeaseLostError, TaskgateError
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.context import Lane, RunContext, enter, leave
from taskgate.runtime.lease import LeaseKeeper, note_fenced
from taskgate.runtime.outcome import (
    Ack,
    Discard,
    Fail,
    Outcome,
    Retry,
    Stop,
    StopReason,
    decide,
    describe,
    unknown_type,
)
from taskgate.task import Task

__all__ = ["Executor", "Handler", "is_async_handler"]

log = logging.getLogger("taskgate")

Handler = Callable[[Task], Any]
Settled = Callable[[Task], Awaitable[None]]

SETTLE_TRIES = 3

_ACK_NONE = Ack(None)  # the outcome of most handlers: one, not one per run


def is_async_handler(fn: Handler) -> bool:
    """True when ``fn`` is a coroutine function (or an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


class Executor:
    """Runs claimed tasks for every queue of one runtime."""

    def __init__(
        self,
        broker: Broker,
        calls: BrokerCalls,
        handlers: Mapping[str, Handler],
        *,
        throttled_max: int,
        thread_limiter: anyio.CapacityLimiter,
        on_settled: Settled,
        keeper: LeaseKeeper,
    ) -> None:
        self._broker, self._calls, self._handlers = broker, calls, handlers
        self._throttled_max = throttled_max
        self._threads = thread_limiter
        self._on_settled = on_settled
        self._keeper = keeper
        self._async: dict[Handler, bool] = {}  # is_async_handler per handler (inspect is slow)

    async def run(self, ctx: RunContext, lane: Lane, *, auto_heartbeat: bool) -> None:
        """Run ``ctx``'s task in ``lane`` to one final write; a cancelled runtime requeues it.

        A handler stopped through its lane (cancel, lease lost, fence, shutdown grace) is
        written here too; the cancellation then goes on to end the lane's scope.
        """
        ctx.lane = lane
        if auto_heartbeat:
            self._keeper.add(ctx)
        try:
            handler = self._handlers.get(ctx.lease.task.type)
            outcome: Outcome
            if handler is None:
                outcome = unknown_type(ctx.task)
            else:
                outcome = _final_outcome(ctx, *await self._call(ctx, handler))
        except anyio.get_cancelled_exc_class():
            ctx.release_slot()
            stopped = _final_outcome(ctx, Discard(), False) if lane.spent else Stop(StopReason.SHUTDOWN)
            with anyio.CancelScope(shield=True):
                await self.settle(ctx, stopped)
            raise
        finally:
            self._keeper.remove(ctx)
        ctx.release_slot()
        if _hand_to_writer(ctx, outcome):
            return  # the common case awaits nothing: the queue's ack writer completes the task
        with anyio.CancelScope(shield=True):
            await self.settle(ctx, outcome)

    async def _call(self, ctx: RunContext, handler: Handler) -> tuple[Outcome, bool]:
        """The handler's own outcome, and whether it returned normally (no raise).

        A handler cancelled through its lane raises out of here (see `run`).
        """
        lane = ctx.lane
        assert lane is not None, "a context runs in a worker's lane"
        token = enter(ctx)
        lane.start(ctx)
        task = ctx.lease.task
        try:
            if self._is_async(handler):
                value = await handler(task)
            else:
                value = await self._in_thread(handler, task)
            outcome: Outcome = _ACK_NONE if value is None else Ack(encode_value(value, what="handler result"))
            finished = True
        except Exception as exc:
            outcome, finished = decide(exc, task, throttled_max=self._throttled_max), False
        finally:
            lane.finish(ctx)
            leave(token)
            if lane.spent:
                note_fenced(ctx)  # unless a stop gave its reason first: the fence deadline passed
        return outcome, finished

    async def _in_thread(self, handler: Handler, task: Task) -> Any:
        # A plain function cannot be interrupted: on cancel the thread is abandoned and its
        # result dropped, so a stuck sync handler never blocks shutdown or fencing.
        return await anyio.to_thread.run_sync(handler, task, abandon_on_cancel=True, limiter=self._threads)

    def _is_async(self, handler: Handler) -> bool:
        try:
            known = self._async.get(handler)
        except TypeError:  # an unhashable callable object
            return is_async_handler(handler)
        if known is None:
            known = self._async[handler] = is_async_handler(handler)
        return known

    async def settle(self, ctx: RunContext, outcome: Outcome) -> None:
        """Write ``outcome`` with the lease token; a stale token means someone else owns the task."""
        if _hand_to_writer(ctx, outcome):
            return
        write = self._write_for(ctx, outcome)
        if write is None:
            return
        for attempt in range(1, SETTLE_TRIES + 1):
            try:
                task = await write()
            except LeaseLostError:
                log.info("task %s: lease was lost before its outcome was written; discarded", ctx.task.id)
                return
            except BrokerError as exc:
                log.warning("task %s: writing the outcome failed (try %d): %s", ctx.task.id, attempt, exc)
                await anyio.sleep(0.05 * 2**attempt)
                continue
            except TaskgateError as exc:
                log.warning("task %s: outcome not written: %s", ctx.task.id, describe(exc))
                return
            await self._on_settled(task)
            return
        log.error("task %s: outcome not written; the reaper will take the task back", ctx.task.id)

    def _write_for(self, ctx: RunContext, outcome: Outcome) -> Callable[[], Awaitable[Task]] | None:
        b, task_id, token = self._broker, ctx.task.id, ctx.lease.token
        deadline = ctx.deadline
        match outcome:
            case Ack(result):
                return lambda: self._calls(b.ack, task_id, token, result, deadline=deadline)
            case Retry(kind, error, delay):
                wait = timedelta(seconds=delay)
                return lambda: self._calls(
                    b.retry, task_id, token, kind=kind, error=error, delay=wait, deadline=deadline
                )
            case Fail(kind, error):
                return lambda: self._calls(b.fail, task_id, token, kind=kind, error=error, deadline=deadline)
            case Stop(StopReason.CANCELED):
                return lambda: self._calls(b.finish_canceled, task_id, token, deadline=deadline)
            case Stop(StopReason.SHUTDOWN):
                return lambda: self._calls(b.requeue, task_id, token, deadline=deadline)
        return None


def _hand_to_writer(ctx: RunContext, outcome: Outcome) -> bool:
    """Queue an ack with the queue's ack writer when it has one; whether it did."""
    if ctx.ack is None or type(outcome) is not Ack:
        return False
    lease = ctx.lease
    ctx.ack(lease.task.id, lease.token, outcome.result)
    return True


def _final_outcome(ctx: RunContext, outcome: Outcome, finished: bool) -> Outcome:
    """Combine the handler's outcome with a stop reason, if the runtime stopped it."""
    reason = ctx.stop_reason
    if reason is None:
        return outcome
    if reason is StopReason.LEASE_LOST:
        return Discard()
    # A handler that completed before the stop landed keeps its result: the work is done.
    return outcome if finished else Stop(reason)
