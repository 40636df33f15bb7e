"""BrokerThreads: blocking calls in a bounded pool, abandoned (not waited for) when cancelled."""

from __future__ import annotations

import contextvars
import os
import threading

import anyio
import pytest

from taskgate.runtime.threads import BrokerThreads

pytestmark = pytest.mark.anyio

GUARD = 10.0
_request: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")


async def test_a_call_runs_in_another_thread_and_returns_or_raises_there():
    threads = BrokerThreads(2)
    where, total = await threads.run(lambda a, b: (threading.get_ident(), a + b), 40, 2)
    assert total == 42 and where != threading.get_ident()

    def broken() -> None:
        raise LookupError("from the thread")

    with pytest.raises(LookupError, match="from the thread"):
        await threads.run(broken)


async def test_a_call_sees_the_callers_context_variables():
    _request.set("r-1")
    assert await BrokerThreads(1).run(_request.get) == "r-1"


async def test_no_more_than_size_calls_run_at_once():
    threads = BrokerThreads(2)
    running, most = 0, 0
    lock, release = threading.Lock(), threading.Event()
    entered = threading.Semaphore(0)

    def call() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        entered.release()
        release.wait(GUARD)
        with lock:
            running -= 1

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(threads.run, call)
        for _ in range(2):
            assert await anyio.to_thread.run_sync(entered.acquire, True, GUARD)
        release.set()  # the other three start as places free up
    assert most == 2


async def test_a_cancelled_wait_abandons_the_running_call_and_frees_its_place():
    threads = BrokerThreads(1)
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def stuck() -> str:
        started.set()
        release.wait(6 * GUARD)  # far past the guard below: only a new thread serves "next"
        finished.set()
        return "dropped"

    with anyio.move_on_after(GUARD) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(threads.run, stuck)
            await anyio.to_thread.run_sync(started.wait, GUARD)
            tg.cancel_scope.cancel()  # the waiter gives up; the thread goes on
    assert not scope.cancelled_caught
    with anyio.fail_after(GUARD):
        assert await threads.run(lambda: "next") == "next"  # the stuck thread does not hold the pool
    release.set()
    assert await anyio.to_thread.run_sync(finished.wait, GUARD)  # it finished on its own


async def test_a_call_cancelled_before_it_starts_never_runs():
    threads = BrokerThreads(1)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def first() -> None:
        started.set()
        release.wait(GUARD)

    async with anyio.create_task_group() as outer:
        outer.start_soon(threads.run, first)
        await anyio.to_thread.run_sync(started.wait, GUARD)
        with anyio.CancelScope() as waiting:
            async with anyio.create_task_group() as tg:
                tg.start_soon(threads.run, lambda: ran.append("queued"))
                await anyio.lowlevel.checkpoint()
                waiting.cancel()  # the call is queued behind `first`
        release.set()
    assert await threads.run(lambda: "after") == "after"
    assert ran == []


async def test_an_already_cancelled_caller_runs_nothing():
    ran: list[str] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        await BrokerThreads(1).run(lambda: ran.append("x"))
    assert ran == []


def test_the_size_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        BrokerThreads(0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_threads_of_its_own():
    threads = BrokerThreads(1)
    assert anyio.run(threads.run, lambda: "parent") == "parent"  # the parent's thread exists now

    async def in_child() -> str:
        with anyio.fail_after(GUARD):
            return await threads.run(lambda: "child")

    pid = os.fork()
    if pid == 0:  # the child: no thread of the parent came along
        try:
            os._exit(0 if anyio.run(in_child) == "child" else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_a_result_that_comes_after_its_waiter_gave_up_goes_to_on_abandoned():
    threads = BrokerThreads(1)
    started, release, cleaned = threading.Event(), threading.Event(), threading.Event()
    late: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(GUARD)
        return "late leases"

    def put_back(result: str) -> None:
        late.append(result)
        cleaned.set()

    with anyio.move_on_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: threads.run(slow, on_abandoned=put_back))
            await anyio.to_thread.run_sync(started.wait, GUARD)
            tg.cancel_scope.cancel()
    release.set()
    assert await anyio.to_thread.run_sync(cleaned.wait, GUARD)
    assert late == ["late leases"]
    # a result its waiter received is not handed over a second time
    assert await threads.run(lambda: "on time", on_abandoned=put_back) == "on time"
    assert late == ["late leases"]


async def test_a_result_that_came_just_as_its_waiter_gave_up_goes_to_on_abandoned():
    # The call answers, and its waiter is cancelled before it resumed to take the answer: the
    # answer is nobody's, so it goes to on_abandoned as a later one would (a claim's leases
    # would otherwise wait for the reaper).
    threads = BrokerThreads(1)
    started, go, next_ran, cleaned = (threading.Event() for _ in range(4))
    late: list[str] = []

    def answers() -> str:
        started.set()
        go.wait(GUARD)
        return "leases"

    def put_back(result: str) -> None:
        late.append(result)
        cleaned.set()

    waiter = anyio.CancelScope()

    async def wait_for_it() -> None:
        with waiter:
            await threads.run(answers, on_abandoned=put_back)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_for_it)
        tg.start_soon(threads.run, next_ran.set)  # queued behind it on the pool's one thread
        await anyio.to_thread.run_sync(started.wait, GUARD)
        # The event loop is blocked from here on purpose: the call answers and the next one
        # runs (so the first is wholly done) while its waiter cannot resume; then it is cancelled.
        go.set()
        next_ran.wait(GUARD)
        waiter.cancel()
    assert await anyio.to_thread.run_sync(cleaned.wait, GUARD)
    assert late == ["leases"]
