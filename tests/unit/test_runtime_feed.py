"""Feed: the scheduler's hand-off to its workers -- in order, never lost, None once closed."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from taskgate.runtime.feed import Feed

pytestmark = pytest.mark.anyio


async def _settle() -> None:
    """Let every ready task run until it parks again."""
    for _ in range(5):
        await anyio.lowlevel.checkpoint()


async def test_parked_workers_take_items_in_the_order_they_parked():
    feed: Feed[int] = Feed()
    got: list[tuple[str, int | None]] = []

    async def worker(name: str) -> None:
        got.append((name, await feed.get()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker, "a")
        await _settle()
        tg.start_soon(worker, "b")
        await _settle()
        feed.put(1)
        feed.put(2)
    assert sorted(got) == [("a", 1), ("b", 2)]  # trio wakes them in any order; items went in order


async def test_items_queue_while_every_worker_is_busy_and_come_out_oldest_first():
    feed: Feed[int] = Feed()
    for item in (1, 2, 3):
        feed.put(item)
    assert [await feed.get() for _ in range(3)] == [1, 2, 3]


async def test_close_lets_workers_drain_what_is_queued_then_gives_none():
    feed: Feed[int] = Feed()
    feed.put(1)
    feed.close()
    assert await feed.get() == 1
    assert await feed.get() is None
    with pytest.raises(RuntimeError, match="closed"):
        feed.put(2)


async def test_close_wakes_parked_workers_with_none():
    feed: Feed[int] = Feed()
    got: list[int | None] = []

    async def worker() -> None:
        got.append(await feed.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        tg.start_soon(worker)
        await _settle()
        feed.close()
    assert got == [None, None]


async def test_an_item_handed_to_a_worker_cancelled_at_that_moment_is_not_lost():
    feed: Feed[int] = Feed()
    got: list[int | None] = []

    async def worker() -> None:
        got.append(await feed.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        await _settle()
        feed.put(7)  # handed over and the worker woken ...
        tg.cancel_scope.cancel()  # ... and cancelled before it runs
    # Either the worker still took it, or it went back to the feed: exactly once either way.
    assert got + feed.drain() == [7]


async def test_a_cancelled_parked_worker_is_not_handed_anything():
    feed: Feed[int] = Feed()
    async with anyio.create_task_group() as tg:
        tg.start_soon(feed.get)
        await _settle()
        tg.cancel_scope.cancel()
    feed.put(1)  # no parked worker is left: it is queued, not lost
    assert feed.drain() == [1]


async def test_items_handed_to_parked_workers_are_in_transit_until_the_workers_resume():
    feed: Feed[int] = Feed()
    resumed: list[int | None] = []

    async def worker() -> None:
        resumed.append(await feed.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        tg.start_soon(worker)
        await _settle()
        assert feed.parked == 2
        feed.put(1)
        feed.put(2)
        feed.put(3)  # no worker parked any more: queued, not in transit
        assert feed.in_transit == 2 and feed.parked == 0 and resumed == []
        await _settle()
        assert feed.in_transit == 0 and sorted(resumed) == [1, 2]
    assert feed.drain() == [3]


async def test_an_item_handed_to_a_worker_cancelled_at_that_moment_is_no_longer_in_transit():
    feed: Feed[int] = Feed()
    got: list[int | None] = []

    async def worker() -> None:
        got.append(await feed.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        await _settle()
        feed.put(7)
        assert feed.in_transit == 1
        tg.cancel_scope.cancel()
    assert feed.in_transit == 0 and got + feed.drain() == [7]


async def test_a_parked_worker_cancelled_then_handed_an_item_before_it_resumes_gives_it_back():
    feed: Feed[int] = Feed()
    scope = anyio.CancelScope()

    async def worker() -> None:
        with scope:
            await feed.get()

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        await _settle()
        scope.cancel()  # the worker is woken by its cancellation but has not run yet ...
        feed.put(7)  # ... so it is still parked when the item is handed to it
        await _settle()
    assert feed.in_transit == 0 and feed.parked == 0 and feed.drain() == [7]
