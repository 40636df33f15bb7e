"""Running one claimed task: call its handler, keep its lease, and write the outcome.

The handler runs inside its worker's cancel scope (`Lane`), next to the lease keeper.
Whatever stopped it decides the write: the handler's own result or exception (`decide`), its
run-time limit (the task's ``timeout``, else its queue's: a `TimeoutError`, decided as any
other exception), or the stop reason (cancel -> `Canceled`, shutdown -> `Requeue`, lease lost ->
nothing). A stopped handler's cancellation goes on up to the lane's scope, which ends it;
the write happens shielded on the way, so a runtime being cancelled still puts its tasks back.

Nothing a handler returns or raises leaves `Executor.run` but a cancellation, an interpreter
exit or an interrupt (a `BaseException` subclass of the handler's own is its failure): a result
the codec or the broker refuses fails the task once with the reason (a retry would only compute
it again), an exception whose text cannot be read or stored is described as well as it can
be (`describe`), and a write that fails for any other reason is logged. A stopped or timed
out plain ``def`` handler cannot be interrupted: its thread is abandoned, but its worker slot
stays taken until the thread returns (`_ThreadRun`), so ``workers`` still bounds what runs.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import anyio

from taskgate.brokers import params
from taskgate.brokers.base import Broker, FailureKind
from taskgate.brokers.checks import storable_error
from taskgate.brokers.params import Canceled, Compensation, Complete, Finish, Requeue, Settle
from taskgate.codec import encode_value
from taskgate.errors import AlreadyFinalError, BrokerError, LeaseLostError, TaskNotFoundError
from taskgate.middleware import Middleware, run_through
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.context import Lane, RunContext, enter, leave
from taskgate.runtime.failures import format_traceback, log_failure
from taskgate.runtime.lease import LeaseKeeper, note_fenced
from taskgate.runtime.observers import Observers
from taskgate.runtime.outcome import (
    Ack,
    Discard,
    Fail,
    Outcome,
    Policy,
    Retry,
    Stop,
    StopReason,
    decide,
    describe,
    unknown_type,
    unstorable_result,
)
from taskgate.runtime.threads import loop_waker
from taskgate.runtime.tracing import RunSpan, Tracing
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
        on_hold: Callable[[str, float], None] = lambda queue, seconds: None,
        policy_for: Callable[[Task], Policy] = lambda task: Policy(),
        compensation_for: Callable[[str], Compensation | None] = lambda task_type: None,
        middleware: Sequence[Middleware] = (),
        observers: Observers | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``on_hold(queue, seconds)`` is told of a queue-wide throttle before its worker is
        free again, so this process starts nothing more of the queue while the hold is written.
        ``policy_for(task)``: the retry policy of a task whose handler raised;
        ``compensation_for(task_type)``: what its final failure submits. ``middleware``:
        wrapped around every handler call, read at each run (a list may grow while it runs).
        ``observers``: told of the outcome of each run. ``tracing``: a span per run."""
        self._broker, self._calls, self._handlers = broker, calls, handlers
        self._middleware = middleware
        self._observers = observers if observers is not None else Observers()
        self._tracing = tracing
        self._policy_for = policy_for
        self._compensation_for = compensation_for
        self._on_hold = on_hold
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
        tracing = self._tracing
        span = tracing.start_run(ctx.task) if tracing is not None else None
        try:
            handler = self._handlers.get(ctx.lease.task.type)
            outcome: Outcome
            if handler is None:
                outcome = unknown_type(ctx.task)
            else:
                outcome = _final_outcome(ctx, *await self._call(ctx, handler))
            if span is not None or self._observers.items:
                self._ended(ctx, span, outcome)
                span = None
        except anyio.get_cancelled_exc_class():
            ctx.release_slot()
            stopped = _final_outcome(ctx, Discard(), False) if lane.spent else Stop(StopReason.SHUTDOWN)
            if span is not None or self._observers.items:
                self._ended(ctx, span, stopped)
                span = None
            with anyio.CancelScope(shield=True):
                await self.settle(ctx, stopped)
            raise
        finally:
            self._keeper.remove(ctx)
            if span is not None and tracing is not None:  # the run ended by an error of the runtime
                tracing.end_run(span, None)
        if type(outcome) is Retry and outcome.hold_queue:
            self._on_hold(ctx.task.queue, outcome.delay)
        ctx.release_slot()
        if _hand_to_writer(ctx, outcome):
            return  # the common case awaits nothing: the queue's ack writer completes the task
        with anyio.CancelScope(shield=True):
            await self.settle(ctx, outcome)

    def _ended(self, ctx: RunContext, span: RunSpan | None, outcome: Outcome) -> None:
        """Tell the run's span (ending it) and the observers how it ended."""
        if span is not None and self._tracing is not None:
            self._tracing.end_run(span, outcome)
        if self._observers:
            self._observers.finished(ctx.task, outcome)

    async def _call(self, ctx: RunContext, handler: Handler) -> tuple[Outcome, bool]:
        """The handler's own outcome, and whether it returned normally (no raise).

        A handler cancelled through its lane raises out of here (see `run`).
        """
        lane = ctx.lane
        assert lane is not None, "a context runs in a worker's lane"
        token = enter(ctx)
        lane.start(ctx)
        task = ctx.lease.task
        outcome: Outcome
        try:
            if self._middleware:
                value = await run_through(self._middleware, task, lambda: self._invoke(ctx, handler, task))
            elif ctx.timeout is not None:
                value = await self._within(ctx.timeout, ctx, handler, task)
            elif self._is_async(handler):
                value = await handler(task)
            else:
                value = await self._in_thread(ctx, handler, task)
            outcome, finished = _ACK_NONE if value is None else _encoded(value), True
        except Exception as exc:
            outcome, finished = self._decide(exc, task), False
        except BaseException as exc:
            if _ends_the_run(exc):
                raise
            # A handler's own BaseException subclass is its failure, not the gate's.
            outcome, finished = self._decide(exc, task), False
        finally:
            lane.finish(ctx)
            leave(token)
            if lane.spent:
                note_fenced(ctx)  # unless a stop gave its reason first: the fence deadline passed
        return outcome, finished

    async def _invoke(self, ctx: RunContext, handler: Handler, task: Task) -> Any:
        """The handler's value, under its run-time limit if it has one (`_call`'s path through
        middleware)."""
        if ctx.timeout is not None:
            return await self._within(ctx.timeout, ctx, handler, task)
        if self._is_async(handler):
            return await handler(task)
        return await self._in_thread(ctx, handler, task)

    async def _within(self, limit: timedelta, ctx: RunContext, handler: Handler, task: Task) -> Any:
        """The handler's value, or `TimeoutError` when it ran past ``limit`` (a business
        failure, decided as any other).

        Only a run with a limit pays for a cancel scope of its own. A sync handler's thread is
        abandoned as on any stop (`_in_thread`), keeping its worker slot until it returns. What
        a handler raises once its limit cancelled it (a cleanup's error) is the timeout too.
        """
        scope = anyio.move_on_after(limit.total_seconds())
        try:
            with scope:
                if self._is_async(handler):
                    return await handler(task)
                return await self._in_thread(ctx, handler, task)
        except Exception as exc:
            if scope.cancel_called:
                raise _timed_out(limit) from exc
            raise
        raise _timed_out(limit)

    def _decide(self, exc: BaseException, task: Task) -> Outcome:
        """`decide`, which never raises: whatever a handler raised, its task gets an outcome,
        carrying the handler's traceback, and the failure is logged (`log_failure`)."""
        try:
            outcome = decide(exc, task, throttled_max=self._throttled_max, policy=self._policy_for(task))
        except Exception as broken:
            log.exception("task %s: the handler's failure could not be decided; the task fails", task.id)
            outcome = Fail(
                FailureKind.SKIP,
                storable_error(f"the handler's failure could not be decided: {describe(broken)}"),
            )
        if isinstance(outcome, Retry | Fail):
            outcome = dataclasses.replace(outcome, traceback=format_traceback(exc))
        log_failure(exc, task, outcome)
        return outcome

    async def _in_thread(self, ctx: RunContext, handler: Handler, task: Task) -> Any:
        # A plain function cannot be interrupted: on cancel the thread is abandoned and its
        # result dropped, so a stuck sync handler never blocks shutdown or fencing. Its worker
        # slot stays taken until the thread returns (`_ThreadRun`): the slot's next task must
        # not run beside it.
        run = _ThreadRun(handler, task)
        try:
            return await anyio.to_thread.run_sync(run, abandon_on_cancel=True, limiter=self._threads)
        except BaseException:
            run.abandon(ctx)
            raise

    def _is_async(self, handler: Handler) -> bool:
        try:
            known = self._async.get(handler)
        except TypeError:  # an unhashable callable object
            return is_async_handler(handler)
        if known is None:
            known = self._async[handler] = is_async_handler(handler)
        return known

    async def settle(self, ctx: RunContext, outcome: Outcome) -> None:
        """Write ``outcome`` with the lease token; a stale token means someone else owns the task.

        Nothing raised on the way leaves here (only a cancellation): an outcome the broker
        refuses (a result too large, a value it cannot take) fails the task once with the
        reason instead (`_refused`); anything else is logged.
        """
        if _hand_to_writer(ctx, outcome):
            return
        try:
            task = await self._write(ctx, outcome)
            if task is not None:
                await self._on_settled(task)
        except Exception:
            log.exception("task %s: settling its outcome failed", ctx.task.id)

    async def _write(self, ctx: RunContext, outcome: Outcome) -> Task | None:
        """Write ``outcome`` (trying a medium that failed again); the snapshot, None if not written."""
        attempt = 0
        while attempt < SETTLE_TRIES:
            attempt += 1
            try:
                return await self._write_once(ctx, outcome)
            except LeaseLostError:
                log.info("task %s: lease was lost before its outcome was written; discarded", ctx.task.id)
                return None
            except BrokerError as exc:
                log.warning("task %s: writing the outcome failed (try %d): %s", ctx.task.id, attempt, exc)
                await anyio.sleep(0.05 * 2**attempt)
            except (TaskNotFoundError, AlreadyFinalError) as exc:
                log.warning("task %s: outcome not written: %s", ctx.task.id, describe(exc))
                return None
            except Exception as exc:
                instead = _refused(outcome, exc)
                log.warning("task %s: the broker refused the outcome: %s", ctx.task.id, describe(exc))
                if instead is None:
                    return None
                outcome, attempt = instead, 0
        log.error("task %s: outcome not written; the reaper will take the task back", ctx.task.id)
        return None

    async def _write_once(self, ctx: RunContext, outcome: Outcome) -> Task | None:
        """One broker call writing ``outcome``; None for an outcome that writes nothing."""
        item = _settle_item(ctx.task, ctx.lease.token, outcome, self._compensation_for)
        if item is None:
            return None
        (answer,) = await self._calls(self._broker.settle, Settle((item,)), deadline=ctx.deadline)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _settle_item(
    task: Task, token: str, outcome: Outcome, compensation_for: Callable[[str], Compensation | None]
) -> Finish | None:
    """The `Settle` item writing ``outcome``; None for an outcome that writes nothing. Builds
    a value the item refuses (a delay out of range) raise as the broker would have. A failure
    carries the compensation of ``task``'s type."""
    task_id = task.id
    match outcome:
        case Ack(result):
            return Complete(task_id, token, result)
        case Retry(kind, error, delay, hold_queue, traceback):
            return params.Retry(task_id, token, kind, error, timedelta(seconds=delay), hold_queue, traceback)
        case Fail(kind, error, traceback):
            return params.Fail(task_id, token, kind, error, traceback, compensation_for(task.type))
        case Stop(StopReason.CANCELED):
            return Canceled(task_id, token)
        case Stop(StopReason.SHUTDOWN):
            return Requeue(task_id, token)
    return None


class _ThreadRun:
    """A sync handler's call in its worker thread, which keeps the worker's slot when abandoned.

    A cancelled wait abandons the thread (it cannot be interrupted), but the handler goes on
    running in it: its slot goes back only when it returns, so ``workers`` bounds the
    handlers running, abandoned or not. Shutdown never waits for it: the worker itself goes
    on (its lease's outcome is written at once), only the scheduler's count stays taken.
    """

    __slots__ = ("give_back", "handler", "lock", "state", "task")

    def __init__(self, handler: Handler, task: Task) -> None:
        self.handler, self.task = handler, task
        self.lock = threading.Lock()
        self.state = _WAITING
        # Set only when abandoned while running: how the thread reaches the event loop, and
        # the slot's release to run there.
        self.give_back: tuple[Callable[[Callable[[], None]], Any], Callable[[], None]] | None = None

    def __call__(self) -> Any:
        with self.lock:
            if self.state is _ABANDONED:
                return None  # abandoned before it started: its slot is back already
            self.state = _RUNNING
        try:
            return self.handler(self.task)
        finally:
            with self.lock:
                self.state = _DONE
                give_back, self.give_back = self.give_back, None
            if give_back is not None:
                wake, free = give_back
                try:
                    wake(free)
                except RuntimeError:
                    pass  # the event loop is gone, and the slot with it

    def abandon(self, ctx: RunContext) -> None:
        """The wait for the thread ended early (cancelled): keep ``ctx``'s slot while it runs."""
        with self.lock:
            if self.state is _RUNNING:
                free = ctx.keep_slot()
                if free is not None:
                    self.give_back = loop_waker(), free  # on the event loop: its waker is at hand
            elif self.state is _WAITING:
                self.state = _ABANDONED


_WAITING, _RUNNING, _DONE, _ABANDONED = "waiting", "running", "done", "abandoned"


def _timed_out(limit: timedelta) -> TimeoutError:
    """The error of a run cancelled by its ``limit``: ``ran longer than 30s (timeout)``."""
    seconds = f"{limit.total_seconds():.3f}".rstrip("0").rstrip(".")
    return TimeoutError(f"ran longer than {seconds}s (timeout)")


def _hand_to_writer(ctx: RunContext, outcome: Outcome) -> bool:
    """Queue an ack with the queue's ack writer when it has one; whether it did."""
    if ctx.ack is None or type(outcome) is not Ack:
        return False
    lease = ctx.lease
    ctx.ack(lease.task.id, lease.token, outcome.result)
    return True


def _ends_the_run(exc: BaseException) -> bool:
    """Whether ``exc``, raised out of a handler, must go on up rather than fail the task: a
    cancellation (the lane's stop, or the runtime's), an interpreter exit or interrupt, or a
    group that may hold one of them."""
    return isinstance(
        exc,
        (anyio.get_cancelled_exc_class(), KeyboardInterrupt, SystemExit, GeneratorExit, BaseExceptionGroup),
    )


def _encoded(value: Any) -> Outcome:
    """The ack of a handler's result, or its failure when the codec cannot store the value."""
    try:
        return Ack(encode_value(value, what="handler result"))
    except Exception as exc:  # not JSON (TypeError), too deep (RecursionError), a broken __str__...
        return unstorable_result(exc)


def _refused(outcome: Outcome, exc: Exception) -> Fail | None:
    """What to write instead of ``outcome`` the broker refused with ``exc`` (an error about the
    value, not about the medium): each counted once, and the last try is a plain text."""
    match outcome:
        case Ack():
            return unstorable_result(exc)
        case Retry(kind, error, _, _, traceback):
            # A refused retry counted nothing: failing it counts the run once.
            return Fail(kind, storable_error(f"{error} (its retry was refused: {describe(exc)})"), traceback)
        case Fail(kind, error) if error != _REFUSED:
            return Fail(kind, _REFUSED)
    return None


# The last word on an outcome the broker refused: a plain text every broker takes.
_REFUSED = "the broker refused to store this task's outcome (see the log of the process that ran it)"


def _final_outcome(ctx: RunContext, outcome: Outcome, finished: bool) -> Outcome:
    """Combine the handler's outcome with a stop reason, if the runtime stopped it."""
    reason = ctx.stop_reason
    if reason is None:
        return outcome
    if reason is StopReason.LEASE_LOST:
        return Discard()
    # A handler that completed before the stop landed keeps its result: the work is done.
    return outcome if finished else Stop(reason)
