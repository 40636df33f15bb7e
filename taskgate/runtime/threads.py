"""Broker threads: the worker threads that run blocking broker calls for the runtime.

``anyio.to_thread.run_sync`` spends about as much again as the bare hop on its bookkeeping
(capacity limiter, cancel scope and worker-state tracking per call), and the runtime hops at
least twice per batch of tasks (the claim and the group ack). Here a call is one queue put,
one thread wake-up and one thread-safe callback to the waiting loop.

Semantics are those of ``to_thread.run_sync(fn, abandon_on_cancel=True, limiter=n)``: at most
``size`` calls run at once and the others wait their turn in order; a waiter cancelled while
its call runs returns at once, and the thread finishes the call on its own with the result
dropped and its place freed for the next call; a call whose waiter was cancelled before it
started never runs. Threads start on demand and end after `IDLE_SECONDS` without work; a
forked child starts with no threads (they do not survive a fork) and makes its own.

A call may name what to do with a result nobody waits for any more (``on_abandoned``, run in
the thread): a claim that answers after its deadline puts its leases back instead of leaving
them to expire. So does one that answered just as its waiter gave up, before the waiter took
the answer.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel

from taskgate import forks

__all__ = ["IDLE_SECONDS", "BrokerThreads", "clean_up", "loop_waker"]

IDLE_SECONDS = 10.0

log = logging.getLogger("taskgate")

T = TypeVar("T")

_QUEUED, _RUNNING, _DONE = range(3)


class _Call(Generic[T]):
    """One call handed to the threads, and what came of it."""

    __slots__ = (
        "abandoned",
        "args",
        "context",
        "done",
        "error",
        "fn",
        "on_abandoned",
        "result",
        "state",
        "wake",
    )

    def __init__(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        wake: Callable[[Callable[[], None]], Any],
        on_abandoned: Callable[[T], object] | None,
    ):
        self.fn, self.args, self.on_abandoned = fn, args, on_abandoned
        self.context = contextvars.copy_context()  # as to_thread: the caller's context variables
        self.done = anyio.Event()
        self.wake = wake  # runs a callable on the waiting loop, from any thread
        self.state = _QUEUED
        self.abandoned = False
        self.result: T | None = None
        self.error: BaseException | None = None


class BrokerThreads:
    """A pool of at most ``size`` busy threads (beyond those left finishing abandoned calls)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self._calls: queue.SimpleQueue[_Call[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0  # alive
        self._idle = 0  # alive and not running a call
        self._queued = 0  # put and not yet taken by a thread
        self._abandoned = 0  # threads still running a call whose waiter gave up
        forks.register(self)

    def after_fork_in_child(self) -> None:
        """In a forked child (`taskgate.forks`): none of the parent's threads, calls or locks."""
        self._calls = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = self._idle = self._queued = self._abandoned = 0

    @property
    def threads(self) -> int:
        """Threads alive now."""
        return self._threads

    async def run(
        self, fn: Callable[..., T], *args: Any, on_abandoned: Callable[[T], object] | None = None
    ) -> T:
        """``fn(*args)`` in a thread; cancelling the wait abandons the call (see the module).

        ``on_abandoned(result)`` runs in the thread when the call returns after its waiter gave up.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled already: nothing runs
        wake = loop_waker()
        call: _Call[T] = _Call(fn, args, wake, on_abandoned)
        self._submit(call)
        try:
            await call.done.wait()
        except BaseException:
            if not self._abandon(call):
                _hand_over_unseen(call)
            raise
        if call.error is not None:
            error, call.error = call.error, None  # no reference cycle through the traceback
            raise error
        return call.result  # type: ignore[return-value]

    def _submit(self, call: _Call[Any]) -> None:
        with self._lock:
            self._queued += 1
            spawn = self._queued > self._idle and self._threads - self._abandoned < self.size
            if spawn:
                self._threads += 1
                self._idle += 1
        self._calls.put(call)
        if spawn:
            threading.Thread(target=self._work, name="taskgate-broker", daemon=True).start()

    def _abandon(self, call: _Call[Any]) -> bool:
        """Mark ``call`` abandoned; False when it had answered already (its thread is done)."""
        with self._lock:
            if call.state == _DONE:
                return False
            call.abandoned = True
            if call.state == _RUNNING:
                self._abandoned += 1  # this thread no longer counts against the size
            return True

    def _work(self) -> None:
        while True:
            try:
                call = self._calls.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._queued == 0:  # no call counts on this thread: it may end
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._queued -= 1
                if call.abandoned:
                    continue  # its waiter gave up before it started: it never runs
                self._idle -= 1
                call.state = _RUNNING
            self._run(call)

    def _run(self, call: _Call[Any]) -> None:
        try:
            call.result = call.context.run(call.fn, *call.args)
        except BaseException as exc:  # handed to the waiter, which re-raises it
            call.error = exc
        with self._lock:
            call.state = _DONE
            abandoned = call.abandoned
        if abandoned:
            if call.on_abandoned is not None and call.error is None:
                clean_up(call.on_abandoned, call.result)
            call.result = call.error = None
            with self._lock:
                self._idle += 1
                self._abandoned -= 1
            return
        with self._lock:
            self._idle += 1
        try:
            call.wake(call.done.set)
        except RuntimeError:
            pass  # the loop closed meanwhile: nobody waits any more


def _hand_over_unseen(call: _Call[Any]) -> None:
    """A call that answered just as its waiter gave up: nobody takes the answer, so it goes to
    ``on_abandoned`` as a later answer would -- in a thread of its own (a broker call may block)."""
    if call.on_abandoned is not None and call.error is None:
        threading.Thread(target=clean_up, args=(call.on_abandoned, call.result), daemon=True).start()
    call.result = call.error = None


def clean_up(on_abandoned: Callable[[Any], object], result: Any) -> None:
    """``on_abandoned(result)``, logging what it raises: nobody is left to raise it to."""
    try:
        on_abandoned(result)
    except Exception:
        log.exception("cleaning up after a broker call that answered too late failed")


def loop_waker() -> Callable[[Callable[[], None]], Any]:
    """How a thread runs a callable on the current event loop: asyncio's
    ``call_soon_threadsafe`` or Trio's ``TrioToken.run_sync_soon``."""
    native = anyio.lowlevel.current_token().native_token
    waker = getattr(native, "call_soon_threadsafe", None) or getattr(native, "run_sync_soon", None)
    if waker is None:
        raise RuntimeError(f"no thread-safe way to wake event loop {native!r}")
    return waker  # type: ignore[no-any-return]
