"""`wait_for_work` over Redis Pub/Sub: no lost wake-ups and no stale ones.

Every script that makes a task ready (enqueue, retry, requeue, reap, replay, a woken child)
``PUBLISH``es on the channel ``<base>signal:<queue>``. A waiter first makes sure it is
SUBSCRIBEd (on a connection of its own, confirmed by the server), drops the messages that
arrived since its last wait, THEN asks Redis whether work is due already, then reads messages:
an enqueue before that shows in the due check, one after it arrives as a message, so nothing
falls in between. It reads in slices of `SLICE` seconds so that `close` is noticed within one
slice, and it also wakes when the earliest delayed task of its queues falls due (by the
broker's clock, measured when the wait began).

Subscriptions outlive a wait: a wait takes an idle subscribed connection (one listening to
its queues when there is one, changing the channels only when asked for other queues) and
gives it back, so a worker polling once a second does not open a TCP connection each time. A
wait whose deadline comes before the server confirmed its SUBSCRIBE answers the due check and
keeps the connection; the next wait reads the confirmations first. A connection that failed
is dropped. A wait of timeout 0 is the due check alone: no Pub/Sub at all (the runtime asks
it before each claim of an idle metered queue).

In a forked child (`taskgate.forks`) the idle subscriptions are the parent's sockets: the child
leaves them alone (reading one would take the parent's messages, resubscribing one would move
the parent's channels) and subscribes on connections of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from taskgate import forks
from taskgate.brokers.redis.keys import KeySpace
from taskgate.brokers.redis.scripts import redis_errors
from taskgate.errors import BrokerError

__all__ = ["SLICE", "SignalWaiter"]

# Longest single read of the subscription, in seconds: the latency of `close` waking a waiter.
SLICE = 0.25

Runner = Callable[[str, Sequence[Any]], list[Any]]


class SignalWaiter:
    """Blocks until a queue is signalled or has due work, or until timeout or close."""

    def __init__(self, client: Any, keys: KeySpace, run: Runner, on_closed: Callable[[], None]) -> None:
        self._client = client
        self._keys = keys
        self._run = run
        self._closed = threading.Event()
        # `on_closed` (closing the pools) runs once, when closed and no wait is using them:
        # closing a socket under a blocked read would raise from redis-py instead of waking it.
        self._on_closed: Callable[[], None] | None = on_closed
        self._active = 0
        self._lock = threading.Lock()
        self._idle: list[_Subscription] = []  # subscribed connections no wait is using
        forks.register(self)

    def after_fork_in_child(self) -> None:
        """In a forked child: none of the parent's subscriptions, waits or locks."""
        forks.keep_inherited(self._idle)  # the parent's sockets: never read nor closed here
        self._idle = []
        self._active = 0  # the parent's waits run in threads this child does not have
        self._lock = threading.Lock()
        closed, self._closed = self._closed.is_set(), threading.Event()
        if closed:
            self._closed.set()

    def close(self) -> None:
        """Make every current and later wait return False within one slice."""
        self._closed.set()
        self._leave(0)

    def _enter(self) -> bool:
        with self._lock:
            if self._closed.is_set():
                return False
            self._active += 1
            return True

    def _leave(self, delta: int) -> None:
        with self._lock:
            self._active -= delta
            done = self._on_closed if self._closed.is_set() and self._active == 0 else None
            idle: list[_Subscription] = []
            if done is not None:
                self._on_closed = None
                idle, self._idle = self._idle, []
        if done is not None:
            for subscription in idle:
                subscription.close()
            done()

    def _take(self, channels: frozenset[bytes]) -> _Subscription:
        """An idle subscription, one listening to ``channels`` if any; else a new one."""
        with self._lock:
            for n, subscription in enumerate(self._idle):
                if subscription.channels == channels:
                    return self._idle.pop(n)
            if self._idle:
                return self._idle.pop()
        return _Subscription(self._client.pubsub())

    def _give_back(self, subscription: _Subscription) -> None:
        with self._lock:
            if not self._closed.is_set():
                self._idle.append(subscription)
                return
        subscription.close()

    def wait(self, queues: Sequence[str], timeout: float) -> bool:
        """True when work is due or a queue was signalled; False on timeout or close."""
        deadline = time.monotonic() + timeout
        if not queues:
            self._closed.wait(timeout)
            return False
        if not self._enter():
            return False
        try:
            with redis_errors("wait_for_work"):
                if timeout <= 0:
                    return self._due_now(queues)
                channels = frozenset(self._keys.signal(q).encode() for q in queues)
                subscription = self._take(channels)
                try:
                    if subscription.listen_to(channels, deadline):
                        woke = self._wait_subscribed(subscription, queues, deadline)
                    else:
                        # No time left to listen: whether work is due now is the answer. The
                        # SUBSCRIBE was sent; the next wait reads its confirmation.
                        woke = self._due_now(queues)
                except BaseException:
                    subscription.close()
                    raise
                self._give_back(subscription)
                return woke
        except BrokerError:
            if self._closed.is_set():
                return False  # closed while subscribing or checking: a wake-up, not a fault
            raise
        finally:
            self._leave(1)

    def _wait_subscribed(self, subscription: _Subscription, queues: Sequence[str], deadline: float) -> bool:
        subscription.drop_pending()  # published before the due check: the check covers them
        due = self._due_monotonic(queues)
        if due is not None and due <= time.monotonic():
            return True
        wake_at = deadline if due is None else min(deadline, due)
        while not self._closed.is_set():
            remaining = wake_at - time.monotonic()
            if remaining <= 0:
                return wake_at < deadline
            if subscription.signalled(min(SLICE, remaining)):
                return True
        return False

    def _due_now(self, queues: Sequence[str]) -> bool:
        """Whether a ready task of ``queues`` is due now, by the broker's clock."""
        now_us, earliest_us = self._run("next_due", list(queues))
        return bool(earliest_us) and int(earliest_us) <= int(now_us)

    def _due_monotonic(self, queues: Sequence[str]) -> float | None:
        """When, on ``time.monotonic``, the earliest ready task of ``queues`` is (or was) due."""
        now_us, earliest_us = self._run("next_due", list(queues))
        if not earliest_us:
            return None
        return time.monotonic() + (int(earliest_us) - int(now_us)) / 1_000_000


class _Subscription:
    """One Pub/Sub connection and the channels the server confirmed it listens to."""

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub
        self.channels: frozenset[bytes] = frozenset()  # asked for (confirmed or not)
        self._unconfirmed: set[bytes] = set()  # subscribed, confirmation not read yet

    def listen_to(self, wanted: frozenset[bytes], deadline: float) -> bool:
        """Subscribe to exactly ``wanted``; False when the server did not confirm by ``deadline``
        (the confirmations still due are read by the next call)."""
        stale, new = self.channels - wanted, wanted - self.channels
        if stale:
            self._pubsub.unsubscribe(*stale)
            self._unconfirmed -= stale  # a late confirmation of one is read and ignored
        if new:
            self._pubsub.subscribe(*new)
            self._unconfirmed |= new
        self.channels = wanted
        while self._unconfirmed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            message = self._pubsub.get_message(timeout=min(SLICE, remaining))
            if message is not None and message["type"] == "subscribe":
                self._unconfirmed.discard(message["channel"])
        return True

    def drop_pending(self) -> None:
        """Read and drop every message already received."""
        while self._pubsub.get_message(timeout=0) is not None:
            pass

    def signalled(self, timeout: float) -> bool:
        """True when a signal arrives within ``timeout`` seconds."""
        message = self._pubsub.get_message(timeout=timeout)
        return message is not None and message["type"] == "message"

    def close(self) -> None:
        """Drop the connection (its subscriptions end with it)."""
        self._pubsub.close()
