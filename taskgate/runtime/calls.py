"""The one door to the broker: every call hops to a worker thread, optionally under a deadline.

The broker protocol is synchronous (see `taskgate.brokers.base`). Calls run on the runtime's
own `BrokerThreads`, apart from handler threads, so handlers can never starve heartbeats; a
cancelled wait abandons its call, so a hung driver call cannot freeze the coroutine waiting
on it: the deadline fires, the thread is left to finish on its own, and the caller gets a
`BrokerError`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from taskgate.brokers import nowait
from taskgate.errors import BrokerError
from taskgate.runtime.threads import BrokerThreads

__all__ = ["BrokerCalls"]

T = TypeVar("T")


class BrokerCalls:
    """Runs broker methods in the runtime's broker threads.

    ``inline=True`` (a broker declaring ``capabilities.nonblocking``) runs them on the event
    loop instead: a thread hop costs far more than an in-memory transition. Each call is
    still a checkpoint, so loops calling the broker cannot starve the event loop.
    ``attempt_inline=True`` (``capabilities.inline_attempts``) first calls them on the event
    loop under `nowait.no_wait`, and hops to a thread only when the broker answers `WouldBlock`.
    """

    def __init__(self, max_threads: int, *, inline: bool = False, attempt_inline: bool = False) -> None:
        self.threads = BrokerThreads(max_threads)
        self.inline = inline
        self.attempt_inline = attempt_inline and not inline

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
        target = functools.partial(fn, *args, **kwargs) if kwargs else fn
        call_args = args if not kwargs else ()
        if deadline is None:
            return await self.threads.run(target, *call_args, on_abandoned=on_abandoned)
        try:
            with anyio.fail_after(deadline):
                return await self.threads.run(target, *call_args, on_abandoned=on_abandoned)
        except TimeoutError:
            name = getattr(fn, "__name__", repr(fn))
            raise BrokerError(f"broker call {name}() did not answer within {deadline:.3g}s") from None
