"""The one door to the broker: every call hops to a worker thread, optionally under a deadline.

The broker protocol is synchronous (see `taskgate.brokers.base`). Calls run on the runtime's
own `BrokerThreads`, apart from handler threads, so handlers can never starve heartbeats; a
cancelled wait abandons its call, so a hung driver call cannot freeze the coroutine waiting
on it: the deadline fires, the thread is left to finish on its own, and the caller gets a
`BrokerError`. A broker that splits its calls (`taskgate.brokers.split`) sends the request
from the event loop and the loop waits for the reply; a caller giving up hands the rest of
the call to a thread, so it ends as an abandoned thread call would.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from taskgate.brokers import nowait
from taskgate.brokers.split import SplitCall
from taskgate.errors import BrokerError
from taskgate.runtime.threads import BrokerThreads, clean_up

__all__ = ["BrokerCalls"]

T = TypeVar("T")


class BrokerCalls:
    """Runs broker methods in the runtime's broker threads.

    ``inline=True`` (a broker declaring ``capabilities.nonblocking``) runs them on the event
    loop instead: a thread hop costs far more than an in-memory transition. Each call is
    still a checkpoint, so loops calling the broker cannot starve the event loop.
    ``attempt_inline=True`` (``capabilities.inline_attempts``) first calls them on the event
    loop under `nowait.no_wait`, and hops to a thread only when the broker answers `WouldBlock`.
    ``split`` (``capabilities.split_calls``: the broker's `SplitCaller.split`) sends the calls
    it splits from the event loop and waits there for their replies.
    """

    def __init__(
        self,
        max_threads: int,
        *,
        inline: bool = False,
        attempt_inline: bool = False,
        split: Callable[..., SplitCall[Any] | None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``on_error(exc)`` is told of each `BrokerError` a call raises (metrics)."""
        self.on_error = on_error
        self.threads = BrokerThreads(max_threads)
        self.inline = inline
        self.attempt_inline = attempt_inline and not inline
        self.split = None if inline else split

    async def __call__(
        self,
        fn: Callable[..., T],
        /,
        *args: Any,
        deadline: float | None = None,
        on_abandoned: Callable[[T], object] | None = None,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` in a thread; raise `BrokerError` past ``deadline`` seconds.

        ``on_abandoned(result)`` runs in the thread if the call answers after the caller gave up.
        """
        # try costs nothing until something raises (3.11+): this is every broker call's path.
        try:
            if self.inline:
                # The yield comes first: a cancellation lands before the transition, never between
                # it and the caller (a claimed lease dropped there would wait for the reaper).
                await anyio.lowlevel.checkpoint()
                return fn(*args, **kwargs)
            if self.attempt_inline:
                await anyio.lowlevel.checkpoint()  # as above
                try:
                    with nowait.no_wait():
                        return fn(*args, **kwargs)
                except nowait.WouldBlock:
                    pass  # nothing was changed: the same call runs in a thread below
            if self.split is not None:
                # A caller cancelled already sends nothing; the wait for the reply is the checkpoint.
                await anyio.lowlevel.checkpoint_if_cancelled()
                call = self.split(fn, *args, **kwargs)
                if call is not None:
                    try:
                        return await _reply(call, fn, deadline, on_abandoned)
                    except nowait.WouldBlock:
                        pass  # nothing ran: the same call runs in a thread below
            target = functools.partial(fn, *args, **kwargs) if kwargs else fn
            call_args = args if not kwargs else ()
            if deadline is None:
                return await self.threads.run(target, *call_args, on_abandoned=on_abandoned)
            try:
                with anyio.fail_after(deadline):
                    return await self.threads.run(target, *call_args, on_abandoned=on_abandoned)
            except TimeoutError:
                raise _no_answer(fn, deadline) from None

        except BrokerError as exc:
            if self.on_error is not None:
                self.on_error(exc)
            raise


def _no_answer(fn: Callable[..., Any], seconds: float) -> BrokerError:
    name = getattr(fn, "__name__", repr(fn))
    return BrokerError(f"broker call {name}() did not answer within {seconds:.3g}s")


async def _reply(
    call: SplitCall[T],
    fn: Callable[..., T],
    deadline: float | None,
    on_abandoned: Callable[[T], object] | None,
) -> T:
    """Wait on the event loop for a split call's reply, then its answer.

    Without a deadline the wait is bounded by the call's socket timeout, as the same call in a
    thread would be. A caller that stops waiting before the reply is whole (cancelled, or its
    deadline passed) leaves the rest to a thread of its own: it reads the reply and gives the
    answer to ``on_abandoned``, as `BrokerThreads` does for a call whose waiter gave up.
    """
    seconds = call.timeout if deadline is None else deadline
    try:
        if seconds == math.inf:  # no bound, as for the same call in a thread: no scope to enter
            await _received(call)
        else:
            with anyio.fail_after(seconds):
                await _received(call)
    except BrokerError:
        raise  # the connection broke: the call is over, nothing is left to read
    except BaseException as exc:
        threading.Thread(target=_finish_abandoned, args=(call, on_abandoned), daemon=True).start()
        if isinstance(exc, TimeoutError):
            raise _no_answer(fn, seconds) from None
        raise
    return call.result()


async def _received(call: SplitCall[Any]) -> None:
    while True:
        await anyio.wait_readable(call.fileno())
        if call.receive():
            return


def _finish_abandoned(call: SplitCall[T], on_abandoned: Callable[[T], object] | None) -> None:
    try:
        result = call.finish()
    except Exception:  # nobody waits for the answer, and a call that failed left nothing to undo
        return
    if on_abandoned is not None:
        clean_up(on_abandoned, result)
