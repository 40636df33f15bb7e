"""BrokerCalls: where a broker method runs -- a thread, the event loop, or the loop first."""

from __future__ import annotations

import threading

import pytest

from taskgate.brokers import nowait
from taskgate.runtime.calls import BrokerCalls

pytestmark = pytest.mark.anyio


class _Recorder:
    """A broker method that records where it ran; raises `WouldBlock` on the loop if told to."""

    def __init__(self, *, would_block: bool = False) -> None:
        self.would_block = would_block
        self.runs: list[tuple[int, bool]] = []  # (thread, inside no_wait)

    def __call__(self, value: int, *, plus: int = 0) -> int:
        self.runs.append((threading.get_ident(), nowait.active()))
        if self.would_block and nowait.active():
            raise nowait.WouldBlock("the test says so")
        return value + plus


async def test_an_inline_attempt_that_succeeds_runs_once_on_the_event_loop():
    calls = BrokerCalls(4, attempt_inline=True)
    method = _Recorder()
    assert await calls(method, 40, plus=2) == 42
    assert method.runs == [(threading.get_ident(), True)]


async def test_an_attempt_that_would_block_runs_again_in_a_thread_without_the_mark():
    calls = BrokerCalls(4, attempt_inline=True)
    method = _Recorder(would_block=True)
    assert await calls(method, 1, plus=1) == 2
    (loop_run, thread_run) = method.runs
    assert loop_run == (threading.get_ident(), True)
    assert thread_run[0] != threading.get_ident() and thread_run[1] is False


async def test_an_inline_attempt_that_fails_is_not_run_again():
    calls = BrokerCalls(4, attempt_inline=True)
    runs: list[int] = []

    def broken() -> None:
        runs.append(threading.get_ident())
        raise LookupError("a real failure, not a wait")

    with pytest.raises(LookupError, match="real failure"):
        await calls(broken)
    assert runs == [threading.get_ident()]


async def test_without_inline_attempts_every_call_hops_to_a_thread():
    calls = BrokerCalls(4)
    method = _Recorder()
    await calls(method, 1)
    ((thread, marked),) = method.runs
    assert thread != threading.get_ident() and marked is False


async def test_a_nonblocking_broker_is_never_marked():
    # ``inline`` runs every call on the loop already; nothing there may answer WouldBlock.
    calls = BrokerCalls(4, inline=True, attempt_inline=True)
    method = _Recorder()
    await calls(method, 1)
    assert method.runs == [(threading.get_ident(), False)]


def test_the_mark_is_per_thread_and_nests():
    seen: list[bool] = []
    with nowait.no_wait():
        with nowait.no_wait():
            assert nowait.active()
        assert nowait.active()
        worker = threading.Thread(target=lambda: seen.append(nowait.active()))
        worker.start()
        worker.join()
    assert not nowait.active()
    assert seen == [False]
