"""Back-pressure across producer processes sharing one store (SQLite, PostgreSQL, MariaDB, Redis).

``on_full="raise"``: two producers race to submit more than the limit; exactly the limit goes
in, the rest raise -- the count is atomic with the insert, so two processes cannot both pass
at one below the limit. ``on_full="block"``: two producers submit far more than the limit
while a worker process drains the queue; every task goes in and is completed, and an observer
reading the store all along never sees more than the limit waiting.
"""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import pytest
from backpressure_worker import ProcessSpec, drain, produce

from taskgate.brokers import open_broker
from taskgate.brokers.params import QueueQuery
from taskgate.task import Filter, Status

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")
JOIN_TIMEOUT = 120.0
PRODUCERS = 2


def _spec(store: tuple[str, dict[str, Any]], **fields: Any) -> ProcessSpec:
    url, options = store
    return ProcessSpec(url=url, broker_options=options, **fields)


def _run(producer: ProcessSpec, worker: ProcessSpec | None) -> list[tuple[int, int]]:
    """Run `PRODUCERS` producers (and the worker, if any) released together; each producer's
    ``(stored, refused)``."""
    ready = SPAWN.Barrier(PRODUCERS + (worker is not None))
    answers = SPAWN.Queue()
    children = [SPAWN.Process(target=produce, args=(producer, ready, answers)) for _ in range(PRODUCERS)]
    if worker is not None:
        children.append(SPAWN.Process(target=drain, args=(worker, ready)))
    for child in children:
        child.start()
    results = [answers.get(timeout=JOIN_TIMEOUT) for _ in range(PRODUCERS)]
    for child in children:
        child.join(JOIN_TIMEOUT)
    assert [child.exitcode for child in children] == [0] * len(children)
    return results


def test_raise_mode_stores_exactly_the_limit_across_two_producers(store: tuple[str, dict[str, Any]]) -> None:
    each, limit = 20, 15
    results = _run(_spec(store, max_pending=limit, on_full="raise", count=each), None)
    assert sum(stored for stored, _ in results) == limit
    assert sum(refused for _, refused in results) == PRODUCERS * each - limit
    broker = open_broker(store[0], **store[1])
    try:
        assert broker.queue_state(QueueQuery("q")).queue_len == limit
        assert len(broker.list(Filter(queue="q"))) == limit
    finally:
        broker.close()


def test_block_mode_lets_every_task_in_as_a_worker_drains_never_past_the_limit(
    store: tuple[str, dict[str, Any]],
) -> None:
    each, limit = 30, 4
    broker = open_broker(store[0], **store[1])
    seen: list[int] = []
    done = threading.Event()

    def observe() -> None:  # the store's own count, read all along
        while not done.is_set():
            seen.append(broker.queue_state(QueueQuery("q")).queue_len)
            done.wait(0.005)

    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    try:
        results = _run(
            _spec(store, max_pending=limit, count=each),
            _spec(store, max_pending=limit, count=PRODUCERS * each),
        )
    finally:
        done.set()
        observer.join(JOIN_TIMEOUT)
    try:
        assert results == [(each, 0)] * PRODUCERS
        tasks = broker.list(Filter(queue="q"))
        assert len(tasks) == PRODUCERS * each
        assert {t.status for t in tasks} == {Status.COMPLETED}
    finally:
        broker.close()
    assert len(seen) > 10 and max(seen) <= limit, (len(seen), max(seen))
    assert max(seen) == limit  # the producers kept the queue full while it drained
