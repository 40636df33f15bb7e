"""The running handler's context: its lease, the worker `Lane` it runs in, and `renew_lease`.

A `RunContext` lives as long as one claim of one task. Heartbeats (automatic or through
`renew_lease`) go through it, and so does every reason to stop the handler from outside:
cancel requested, lease lost (reaped or fenced), shutdown. The first reason wins.

Handlers run in their worker's cancel scope (`Lane`), not in one scope each: entering and
leaving a cancel scope per task costs more than a short handler. Stopping a handler cancels
its lane's scope while that handler is the one running in it; the worker then goes on in a
new scope.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
import anyio.from_thread

from taskgate.brokers.base import Broker, Lease
from taskgate.brokers.params import Heartbeat
from taskgate.errors import LeaseLostError, NoTaskError, TaskCanceledError, TaskNotFoundError
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.outcome import StopReason
from taskgate.task import Task

__all__ = ["FENCE_MARGIN", "Lane", "RunContext", "current_context", "renew_lease", "renew_lease_sync"]

# Fence this fraction of the TTL before the local lease deadline: room for the cancellation
# to land and for the broker's clock to run a little faster than ours.
FENCE_MARGIN = 0.05

_current: contextvars.ContextVar[RunContext] = contextvars.ContextVar("taskgate_run_context")


class Lane:
    """The cancel scope one worker runs its handlers in, one handler at a time.

    The worker enters `scope` once and keeps it across tasks until it is `spent` (a handler in
    it was stopped, or passed its fence deadline); then it opens a new one. Only the handler
    between `start` and `finish` can cancel it, so a late stop never reaches the next task.
    """

    __slots__ = ("running", "scope")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.running: RunContext | None = None

    def open(self) -> anyio.CancelScope:
        """A fresh scope for the worker to enter (the first, or after one was spent)."""
        self.scope = anyio.CancelScope()
        return self.scope

    @property
    def spent(self) -> bool:
        """The scope was cancelled: nothing may await in it any more."""
        return self.scope.cancel_called

    def start(self, ctx: RunContext) -> None:
        """``ctx``'s handler starts: stops and its fence now reach the scope."""
        self.running = ctx
        if ctx.stop_reason is not None:
            self.scope.cancel()  # stopped before it started (shutdown grace ran out)
        elif not ctx.kept:
            ctx.arm_fence()  # no keeper fences it: the deadline does

    def finish(self, ctx: RunContext) -> None:
        """``ctx``'s handler ended (returned, raised or was cancelled)."""
        if self.running is ctx:
            self.running = None
            if not ctx.kept:
                self.scope.deadline = math.inf


@dataclass(eq=False)
class RunContext:
    """One claim of one task, as the runtime tracks it while the handler runs."""

    lease: Lease
    broker: Broker
    calls: BrokerCalls
    ttl: timedelta
    deadline: float
    # The queue whose shared slot the lease holds under its token (renewed with the lease),
    # when the broker counts the queue's limits.
    slot_queue: str | None = None
    # Hands an ack to the queue's group commit (`AckWriter.put`); None: one `Broker.settle` per task.
    ack: Callable[[str, str, bytes | None], None] | None = None
    # The worker's lane; None until a worker picks the context up.
    lane: Lane | None = None
    stop_reason: StopReason | None = None
    lease_deadline: float = 0.0
    kept: bool = False  # a `LeaseKeeper` renews this lease (automatic heartbeats)
    # How long the handler may run (the task's own timeout, else its queue's); None: no limit.
    timeout: timedelta | None = None
    # Gives the worker slot back (running count, concurrency slot, scheduler wake-up); called
    # once, as soon as the handler is done -- before its outcome is written, so the next claim
    # overlaps that write instead of waiting for it. It never waits: a global slot is only
    # noted, and goes back with the queue's next claim.
    free_slot: Callable[[], None] | None = None
    # The durable steps this run has called so far (`taskgate.runtime.steps`), by name; None
    # until its first.
    steps: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # The lease was granted no earlier than now; counting from now would be late, so the
        # claimer passes its pre-claim timestamp in `lease_deadline` and we only fill a default.
        if not self.lease_deadline:
            self.lease_deadline = anyio.current_time() + self.ttl.total_seconds()

    def arm_fence(self) -> None:
        """Cancel the handler at `fence_at` by its lane's deadline (moved by each renewal).

        For leases nobody else watches (``manual_heartbeat``); a `LeaseKeeper` fences the
        leases it keeps itself, with no timer per handler. `Lane.start` arms it first.
        """
        if self.lane is not None and self.lane.running is self:
            self.lane.scope.deadline = self.fence_at

    @property
    def fence_at(self) -> float:
        """When (event-loop time) the handler is cancelled unless the lease was renewed."""
        return self.lease_deadline - self.ttl.total_seconds() * FENCE_MARGIN

    @property
    def task(self) -> Task:
        """The task snapshot taken when it was claimed."""
        return self.lease.task

    def release_slot(self) -> None:
        """The handler returned, raised or was stopped: give its worker slot back (once)."""
        free, self.free_slot = self.free_slot, None
        if free is not None:
            free()

    def keep_slot(self) -> Callable[[], None] | None:
        """Take the slot's release from `release_slot` (then a no-op): the caller gives the
        slot back itself, later (a sync handler still running in its abandoned thread)."""
        free, self.free_slot = self.free_slot, None
        return free

    def stop(self, reason: StopReason) -> None:
        """Stop the handler for ``reason`` (the first reason given wins)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.lane is not None and self.lane.running is self:
            self.lane.scope.cancel()

    def raise_if_stopped(self) -> None:
        """Raise the error `renew_lease` reports for the reason the handler is being stopped."""
        if self.stop_reason is StopReason.LEASE_LOST:
            raise LeaseLostError(f"task {self.task.id}: lease lost; the result will be discarded")
        if self.stop_reason is not None:
            raise TaskCanceledError(
                f"task {self.task.id}: {self.stop_reason.value}; the handler is being cancelled"
            )

    async def renew(self, progress: str | None = None) -> None:
        """Extend the lease (and the handler's global slots) now, storing ``progress`` (JSON
        text) on the task when given; stop the handler and raise when it was canceled, or its
        lease or a slot was lost.

        A `BrokerError` (medium down or too slow) propagates, and the local deadline stays
        where it was: renewals that keep failing end at the fence.
        """
        self.raise_if_stopped()
        started = anyio.current_time()
        beat = Heartbeat(
            self.task.id, self.lease.token, self.ttl, slot_queue=self.slot_queue, progress=progress
        )
        try:
            renewal = await self.calls(self.broker.heartbeat, beat, deadline=self.deadline)
        except (LeaseLostError, TaskNotFoundError):
            self.stop(StopReason.LEASE_LOST)
            raise LeaseLostError(f"task {self.task.id}: lease lost; the result will be discarded") from None
        if renewal.slot_lost and not renewal.cancel_requested:
            # The handler holds its shared slot as it holds its lease, and the slot expires one
            # ttl after ITS last renewal (then another process may take it): a slot already
            # lost stops the handler as a lost lease does.
            self.stop(StopReason.LEASE_LOST)
            raise LeaseLostError(
                f"task {self.task.id}: its concurrency slot expired; the result will be discarded"
            )
        self.lease_deadline = max(self.lease_deadline, started + self.ttl.total_seconds())
        if self.stop_reason is None and not self.kept:
            self.arm_fence()
        if renewal.cancel_requested:
            self.stop(StopReason.CANCELED)
            self.raise_if_stopped()


def current_context(caller: str = "renew_lease()") -> RunContext:
    """The context of the handler running in this task or thread; `NoTaskError` outside one,
    naming ``caller``."""
    ctx = _current.get(None)
    if ctx is None:
        raise NoTaskError(f"{caller} must be called from inside a running task handler")
    return ctx


def enter(ctx: RunContext) -> contextvars.Token[RunContext]:
    """Make ``ctx`` the current context (the executor does this around the handler)."""
    return _current.set(ctx)


def leave(token: contextvars.Token[RunContext]) -> None:
    """Undo `enter`."""
    _current.reset(token)


async def renew_lease() -> None:
    """Extend the running task's lease now (for handlers of ``manual_heartbeat`` queues).

    Raises `TaskCanceledError` when the task was canceled (its scope is being cancelled),
    `LeaseLostError` when the lease was reaped or, under global limits, the task's concurrency
    slot expired (the result will be discarded), `NoTaskError`
    outside a handler, and `BrokerError` when the broker cannot be reached in time.
    """
    await current_context().renew()


def renew_lease_sync() -> None:
    """`renew_lease` for plain ``def`` handlers, which run in a worker thread; same errors."""
    ctx = current_context()
    anyio.from_thread.run(ctx.renew)
