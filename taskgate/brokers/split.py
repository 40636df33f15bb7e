"""Broker calls split in two: the request leaves from the event loop, the loop waits for the reply.

A thread hop costs 100-200 µs on a small machine, as much as a whole Redis script, and it sits
on every submit's and every claim's path. A broker whose calls are one request and one reply
on a socket declares ``capabilities.split_calls`` and implements `SplitCaller`: `split` checks
the arguments, sends the request and hands back a `SplitCall` at once; the runtime waits for the
call's socket with ``anyio.wait_readable`` (asyncio and Trio alike), lets it read what arrived,
and takes the method's answer once the reply is whole. Nothing blocks the event loop: the
request is small enough for the socket's send buffer, and a read follows readiness.

A call the broker cannot split (a method it does not split, a big batch, no connection ready)
answers None and runs whole in a broker thread. A reply that says nothing ran and the call
needs the thread path (a Redis server that lost its functions) raises
`taskgate.brokers.nowait.WouldBlock` from `SplitCall.result`, and the runtime runs the same
call again in a thread. A caller that stops waiting (cancelled, or past its deadline) hands
the call to a thread, which reads the reply to its end (`SplitCall.finish`), as a thread call
abandoned by its waiter finishes on its own.
"""

from __future__ import annotations

import math
import select
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

__all__ = ["MAX_SPLIT_REQUEST", "SplitCall", "SplitCaller"]

# A larger request could fill the socket's send buffer and make the event loop wait for the
# server to read it: such a call is not split, it runs in a thread.
MAX_SPLIT_REQUEST = 64 * 1024

T = TypeVar("T")


class SplitCall(Generic[T]):
    """One broker call whose request was sent; its reply is read by whoever waits for it.

    The broker builds it from what only it knows: the socket to wait on, ``receive`` -- read
    what arrived (only after the socket was readable, so it never waits) and say whether the
    reply is whole; a broken connection raises `BrokerError` -- and ``result`` -- the method's
    answer from the whole reply, or the error it would raise; `WouldBlock` when nothing ran and
    the same call must run again in a thread. ``timeout``: seconds the reply may take before
    the call counts as failed (the socket's own timeout); ``math.inf`` where the same call in
    a thread has no bound either.
    """

    __slots__ = ("_fileno", "_receive", "_result", "timeout")

    def __init__(
        self, fileno: int, receive: Callable[[], bool], result: Callable[[], T], *, timeout: float = math.inf
    ) -> None:
        self._fileno, self._receive, self._result = fileno, receive, result
        self.timeout = timeout

    def fileno(self) -> int:
        """The socket to wait on until it is readable."""
        return self._fileno

    def receive(self) -> bool:
        """Read what arrived (the socket was readable) and say whether the reply is whole."""
        return self._receive()

    def result(self) -> T:
        """The method's answer from the whole reply, or the error it would raise."""
        return self._result()

    def finish(self) -> T:
        """In a thread: wait for the rest of the reply, then `result`.

        Each wait is bounded by `timeout`; a read after a wait that timed out meets the
        connection's own timeout, which fails the call as the broker's own read would.
        """
        poller = select.poll()
        poller.register(self._fileno, select.POLLIN)
        wait_ms = None if math.isinf(self.timeout) else max(1, int(self.timeout * 1000))
        while not self._receive():
            poller.poll(wait_ms)
        return self._result()


@runtime_checkable
class SplitCaller(Protocol):
    """Sending a broker method's request without waiting for its reply.

    Only brokers declaring ``capabilities.split_calls`` implement it.
    """

    def split(self, method: Callable[..., T], /, *args: Any, **kwargs: Any) -> SplitCall[T] | None:
        """Check ``method(*args, **kwargs)``'s arguments as the method would (raising what it
        raises), send its request and return the call; None when this call is not split
        (nothing was sent: run the method in a thread). ``method`` is one of this broker's
        bound methods, or anything else, which is never split."""
        ...
