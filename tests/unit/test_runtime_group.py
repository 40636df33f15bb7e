"""GroupCall: callers arriving together share one flush; each gets its own answer."""

from __future__ import annotations

import anyio
import pytest

from taskgate.runtime.group import GroupCall

pytestmark = pytest.mark.anyio


class Flusher:
    """A flush that records its batches and can be held open by the test."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.hold = False
        self.error: Exception | None = None

    async def __call__(self, items: list[int]) -> list[int | Exception]:
        self.batches.append(items)
        self.entered.set()
        if self.hold:
            await self.release.wait()
        if self.error is not None:
            raise self.error
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


async def test_callers_of_one_tick_share_one_flush_and_get_their_own_answers():
    flush = Flusher()
    group: GroupCall[int, int] = GroupCall(flush, max_batch=10)
    answers: dict[int, object] = {}

    async def call(item: int) -> None:
        try:
            answers[item] = await group(item)
        except ValueError as exc:
            answers[item] = str(exc)

    async with anyio.create_task_group() as tg:
        for item in (2, 3, 4):
            tg.start_soon(call, item)
    assert [sorted(b) for b in flush.batches] == [[2, 3, 4]]  # trio starts tasks in any order
    assert answers == {2: 20, 3: "odd 3", 4: 40}


async def test_callers_during_a_flush_go_together_in_the_next_one():
    flush = Flusher()
    flush.hold = True
    group: GroupCall[int, int] = GroupCall(flush, max_batch=10)
    async with anyio.create_task_group() as tg:
        tg.start_soon(group, 0)
        await flush.entered.wait()
        for item in (2, 4, 6):
            tg.start_soon(group, item)
        await anyio.wait_all_tasks_blocked()
        flush.release.set()
    assert [sorted(b) for b in flush.batches] == [[0], [2, 4, 6]]


async def test_a_failed_flush_raises_in_every_caller_of_that_flush():
    flush = Flusher()
    flush.error = RuntimeError("medium down")
    group: GroupCall[int, int] = GroupCall(flush, max_batch=10)
    errors: list[str] = []

    async def call(item: int) -> None:
        with pytest.raises(RuntimeError) as caught:
            await group(item)
        errors.append(str(caught.value))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, 2)
        tg.start_soon(call, 4)
    assert errors == ["medium down", "medium down"]


async def test_max_batch_splits_a_crowd_into_several_flushes():
    flush = Flusher()
    group: GroupCall[int, int] = GroupCall(flush, max_batch=2)
    async with anyio.create_task_group() as tg:
        for item in (2, 4, 6, 8, 10):
            tg.start_soon(group, item)
    assert [len(b) for b in flush.batches] == [2, 2, 1]


async def test_settled_waits_for_the_flush_in_flight():
    flush = Flusher()
    flush.hold = True
    group: GroupCall[int, int] = GroupCall(flush, max_batch=10)
    order: list[str] = []

    async def settle() -> None:
        await group.settled()
        order.append("settled")

    async with anyio.create_task_group() as tg:
        tg.start_soon(group, 2)
        await flush.entered.wait()
        tg.start_soon(settle)
        await anyio.wait_all_tasks_blocked()
        order.append("released")
        flush.release.set()
    assert order == ["released", "settled"]
    await group.settled()  # idle: returns at once
