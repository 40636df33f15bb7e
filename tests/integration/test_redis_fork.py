"""A forked child of a process holding a `RedisBroker` (a pre-forking server's workers,
``multiprocessing``'s fork start method): it waits for work on subscriptions of its own and
leaves its parent's alone, so both are woken (`taskgate.forks`)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import redis
from helpers.redis_servers import purge_keys

from taskgate.brokers.base import NewTask
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.ids import new_id
from taskgate.testing import steps

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # pytest's own threads may be alive at the fork; the child only waits and exits.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

# A waiter that is signalled every few milliseconds answers within this, or was never woken.
WOKEN_WITHIN = 5.0
CHILD_GUARD = 30  # seconds: a child still running then is killed (SIGALRM)
SIGNAL_EVERY = 0.02


@pytest.fixture
def brokers(
    redis_url: str, unique_prefix: str, client: redis.Redis
) -> Iterator[tuple[RedisBroker, RedisBroker]]:
    """A waiting broker and a submitting one on this test's prefix (server clock)."""
    waiter = RedisBroker(redis_url, key_prefix=unique_prefix)
    submitter = RedisBroker(redis_url, key_prefix=unique_prefix)
    yield waiter, submitter
    waiter.close()
    submitter.close()
    purge_keys(client, KeySpace(unique_prefix).pattern())


@contextmanager
def _signalling(broker: RedisBroker, queue: str) -> Iterator[None]:
    """Submit a task due in an hour to ``queue`` every `SIGNAL_EVERY` seconds until the block
    ends: each submit signals the queue, and none is ever due, so only a signal wakes a waiter
    (whenever it started listening)."""
    stop = threading.Event()

    def submit() -> None:
        while not stop.is_set():
            steps.enqueue(broker, [NewTask(id=new_id(), type="t", queue=queue, delay=timedelta(hours=1))])
            stop.wait(SIGNAL_EVERY)

    submitting = threading.Thread(target=submit)
    submitting.start()
    try:
        yield
    finally:
        stop.set()
        submitting.join()


def _forked(body: Callable[[], bool]) -> int:
    """Fork; the child runs ``body`` and exits 0 when it returned True (1 if it raised, 2 if
    False; killed after `CHILD_GUARD` seconds). In the parent: the child's pid."""
    child = os.fork()
    if child == 0:  # pragma: no cover -- the child reports through its exit status
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(CHILD_GUARD)
            code = 0 if body() else 2
        finally:
            os._exit(code)
    return child


def _exit_code(child: int) -> int:
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_child_waits_on_its_own_subscriptions_and_the_parent_is_still_woken(
    brokers: tuple[RedisBroker, RedisBroker],
) -> None:
    waiter, submitter = brokers
    # The parent's wait leaves its subscription to "q" idle, for its next wait.
    assert waiter.wait_for_work(["q"], 0.5) is False
    # The child waits for another queue (a gate asks only for its idle queues). On the parent's
    # inherited connection, that SUBSCRIBE would move the parent's channels along with it.
    child = _forked(lambda: waiter.wait_for_work(["other"], WOKEN_WITHIN))
    with _signalling(submitter, "other"):
        assert _exit_code(child) == 0, "the child was not woken by a submit"
    with _signalling(submitter, "q"):
        assert waiter.wait_for_work(["q"], WOKEN_WITHIN) is True, "the parent was not woken by a submit"
