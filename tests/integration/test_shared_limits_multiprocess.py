"""A queue's ``workers`` and ``rps`` hold across real worker processes sharing one store.

Three spawned processes each run a `Gate` with the same `QueueConfig` over one database (or
Redis key prefix) and record every handler start and end in a shared ledger
(`limits_worker.Ledger`, stamped with the host's monotonic clock). The ledger, not the
brokers' own counts, is what is checked: it is what a gateway behind the handlers would see.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from limits_worker import Ledger, WorkerSpec, serve

from taskgate.brokers import open_broker
from taskgate.brokers.base import Broker, NewTask
from taskgate.task import Filter, Status
from taskgate.testing import steps

pytestmark = pytest.mark.slow

_T = TypeVar("_T")

SPAWN = multiprocessing.get_context("spawn")
PROCESSES = 3
JOIN_TIMEOUT = 120.0


def _broker(store: tuple[str, dict[str, Any]]) -> Broker:
    url, options = store
    return open_broker(url, **options)


def _submit(store: tuple[str, dict[str, Any]], n: int) -> list[str]:
    broker = _broker(store)
    try:
        ids = [f"task-{i:03d}" for i in range(n)]
        steps.enqueue(broker, [NewTask(id=task_id, type="t", queue="q") for task_id in ids])
        return ids
    finally:
        broker.close()


def _start(specs: list[WorkerSpec], then: Callable[[], _T]) -> tuple[list[Any], _T]:
    """Start one child per spec; once every child's gate runs, call ``then`` (submit the tasks)
    and let the children go on. The children, and what ``then`` answered."""
    ready, go = SPAWN.Barrier(len(specs) + 1), SPAWN.Barrier(len(specs) + 1)
    children = [SPAWN.Process(target=serve, args=(spec, ready, go)) for spec in specs]
    for child in children:
        child.start()
    ready.wait(JOIN_TIMEOUT)
    answer = then()
    go.wait(JOIN_TIMEOUT)
    return children, answer


def _run(specs: list[WorkerSpec], then: Callable[[], _T]) -> _T:
    """`_start`, then wait for every child to end well."""
    children, answer = _start(specs, then)
    for child in children:
        child.join(JOIN_TIMEOUT)
    assert [child.exitcode for child in children] == [0] * len(children)
    return answer


def _spec(store: tuple[str, dict[str, Any]], ledger: Path, total: int, **queue: Any) -> WorkerSpec:
    url, options = store
    return WorkerSpec(url=url, ledger=str(ledger), queue=queue, total=total, broker_options=options)


def _most_at_once(runs: list[tuple[int, int, str, int]]) -> int:
    """Most runs in progress at one instant; at equal times an end counts before a start."""
    events = [(start, 1) for start, _, _, _ in runs] + [(end, -1) for _, end, _, _ in runs]
    level = peak = 0
    for _, delta in sorted(events):
        level += delta
        peak = max(peak, level)
    return peak


def _completed_once(store: tuple[str, dict[str, Any]], ids: list[str]) -> None:
    broker = _broker(store)
    try:
        tasks = broker.list(Filter(type="t"))
    finally:
        broker.close()
    assert sorted(t.id for t in tasks) == ids
    assert {t.status for t in tasks} == {Status.COMPLETED}


def test_workers_hold_across_three_processes(store: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "ledger"))
    spec = _spec(store, Path(ledger.path), 30, workers=2)
    hold = WorkerSpec(**{**spec.__dict__, "hold": 0.08})  # runs for a second or more
    ids = _run([hold] * PROCESSES, lambda: _submit(store, 30))

    runs = ledger.runs()
    assert sorted(task_id for _, _, task_id, _ in runs) == ids  # each handler ran once
    assert _most_at_once(runs) == 2  # reached, never passed, by three processes of 2 workers
    assert len({pid for _, _, _, pid in runs}) >= 2  # the processes took turns at the slots
    _completed_once(store, ids)


def test_rate_holds_across_three_processes(store: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    rps, burst, slack = 10.0, 2, 0.001
    ledger = Ledger(str(tmp_path / "ledger"))
    spec = _spec(store, Path(ledger.path), 16, workers=4, rps=rps, burst=burst)
    ids = _run([spec] * PROCESSES, lambda: _submit(store, 16))

    assert len(ledger.starts()) == len(ids)
    starts = ledger.claims()  # on the store's clock: a loaded process records its start late
    # In every window, at most burst + rps x its length starts (``slack``: the clock's
    # microseconds, which the rate rounds to).
    worst = max(
        (j - i + 1) - (burst + rps * ((starts[j] - starts[i]) / 1e9 + slack))
        for i in range(len(starts))
        for j in range(i, len(starts))
    )
    assert worst <= 1e-9
    # One rate for the three processes, not one each: the starts took their time.
    assert (starts[-1] - starts[0]) / 1e9 >= (len(ids) - burst) / rps - slack
    _completed_once(store, ids)


def test_a_queue_wide_throttle_holds_every_process_until_retry_after(
    store: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    # Starts may follow the throttle by ``IN_FLIGHT``: a claim another process committed before
    # the hold was written (the throttle is recorded before the handler raises) still starts
    # its tasks. The hold ends ``retry_after`` after it was written, on the store's clock (this
    # host's), which the ledger's monotonic clock may read up to ``CLOCKS`` apart.
    retry_after, in_flight, clocks = 1.0, 0.25, 0.02
    ledger = Ledger(str(tmp_path / "ledger"))
    spec = _spec(store, Path(ledger.path), 40, workers=2)
    throttling = WorkerSpec(**{**spec.__dict__, "throttle": "task-004", "retry_after": retry_after})
    ids = _run([throttling] * PROCESSES, lambda: _submit(store, 40))

    (throttled_at,) = [e.at for e in ledger.entries() if e.event == "throttle"]
    held = (throttled_at + in_flight * 1e9, throttled_at + (retry_after - clocks) * 1e9)
    starts = ledger.starts()
    assert [at for at in starts if held[0] < at < held[1]] == []  # no process started anything
    # Most tasks were still waiting at the throttle (it is among the first claimed): they ran after.
    assert len([at for at in starts if at >= held[1]]) >= len(ids) // 2
    assert sorted({task_id for _, _, task_id, _ in ledger.runs()}) == ids
    _completed_once(store, ids)


def test_shared_limits_false_counts_workers_in_each_process(
    store: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    ledger = Ledger(str(tmp_path / "ledger"))
    spec = _spec(store, Path(ledger.path), 12, workers=1, shared_limits=False)
    ids = _run([WorkerSpec(**{**spec.__dict__, "hold": 0.2})] * PROCESSES, lambda: _submit(store, 12))

    runs = ledger.runs()
    assert sorted(task_id for _, _, task_id, _ in runs) == ids
    assert _most_at_once(runs) > 1  # each process ran its own worker
    _completed_once(store, ids)


def test_a_killed_slot_holder_gives_its_slots_back_by_lease(
    store: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    ids = _submit(store, 6)
    ledger = Ledger(str(tmp_path / "ledger"))
    queue = {"workers": 2, "lease_ttl": 1.0}
    holder = WorkerSpec(**{**_spec(store, Path(ledger.path), 0, **queue).__dict__, "hold": 3600.0})
    (child,), _ = _start([holder], lambda: None)
    deadline = time.monotonic() + 60
    while len(ledger.starts()) < 2:  # both slots taken by handlers that hang
        assert time.monotonic() < deadline and child.is_alive(), "the holder never took its slots"
        time.sleep(0.02)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(JOIN_TIMEOUT)
    held = {e.task_id for e in ledger.entries()}

    _run([_spec(store, Path(ledger.path), len(ids), **queue)], lambda: None)

    broker = _broker(store)
    try:
        tasks = {t.id: t for t in broker.list(Filter(type="t"))}
    finally:
        broker.close()
    assert {t.status for t in tasks.values()} == {Status.COMPLETED}
    assert {task_id for task_id, t in tasks.items() if t.lease_lost} == held  # reaped, then run


def test_quota_and_shared_workers_together_never_over_issue(
    store: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    limit, period = 3, 1.0
    ledger = Ledger(str(tmp_path / "ledger"))
    spec = _spec(store, Path(ledger.path), 10, workers=2, quota_limit=limit, quota_period=period)
    ids = _run([WorkerSpec(**{**spec.__dict__, "hold": 0.05})] * PROCESSES, lambda: _submit(store, 10))

    runs = ledger.runs()
    assert sorted(task_id for _, _, task_id, _ in runs) == ids
    assert _most_at_once(runs) <= 2
    broker = _broker(store)
    try:
        tasks = broker.list(Filter(type="t"))
    finally:
        broker.close()
    # Each claim stamps ``started_at`` on the store's clock, the one the quota's epoch-aligned
    # windows are counted on: no window saw more starts than the quota allows.
    per_window: dict[int, int] = {}
    for task in tasks:
        assert task.started_at is not None
        window = int(task.started_at.timestamp() // period)
        per_window[window] = per_window.get(window, 0) + 1
    assert max(per_window.values()) <= limit
    assert len(per_window) >= len(ids) // limit  # the quota, not the workers, set the pace
    _completed_once(store, ids)


@pytest.fixture
def grouped_store(store: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """``store``, on the backends that count groups (``capabilities.group_limits``: every
    server backend here; a broker without it is skipped)."""
    broker = _broker(store)
    try:
        if not broker.capabilities.group_limits:
            pytest.skip(f"{type(broker).__name__} does not count groups (capabilities.group_limits)")
    finally:
        broker.close()
    return store


def test_a_group_at_its_limit_holds_only_its_own_tasks_across_processes(
    grouped_store: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    store = grouped_store
    ledger = Ledger(str(tmp_path / "ledger"))
    spec = _spec(store, Path(ledger.path), 16, workers=4, group_workers=1)

    def submit() -> list[str]:
        broker = _broker(store)
        try:
            # The busy tenant's tasks first: the other's queue up behind them.
            tasks = [NewTask(id=f"a-{i:02d}", type="t", queue="q", group="a") for i in range(8)]
            tasks += [NewTask(id=f"b-{i:02d}", type="t", queue="q", group="b") for i in range(8)]
            steps.enqueue(broker, tasks)
            return [task.id for task in tasks]
        finally:
            broker.close()

    ids = _run([WorkerSpec(**{**spec.__dict__, "hold": 0.1})] * PROCESSES, submit)

    runs = ledger.runs()
    assert sorted(task_id for _, _, task_id, _ in runs) == sorted(ids)
    for group in ("a", "b"):
        assert _most_at_once([run for run in runs if run[2].startswith(group)]) == 1
    # b's tasks ran beside a's, not after them: a group at its limit held up no other.
    a_ends = max(end for _, end, task_id, _ in runs if task_id.startswith("a"))
    assert min(start for start, _, task_id, _ in runs if task_id.startswith("b")) < a_ends
    assert _most_at_once(runs) == 2
    _completed_once(store, sorted(ids))
