"""Two worker processes ticking one schedule over one store make exactly one task per tick.

Each spawned process runs a `Gate` with the same every-second schedule over one SQLite file,
PostgreSQL or MariaDB database or Redis key prefix, on the store's real clock, for a few
seconds; each records the ticks it handled (`schedule_worker`). Every tick from the first to
the last has exactly one task, made by exactly one process; while both ran, the other process
found each tick's task made already.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from limits_worker import Ledger
from schedule_worker import NAME, TYPE, ScheduleSpec, serve

from taskgate.brokers import open_broker
from taskgate.schedules import tick_key
from taskgate.task import Filter

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")
PROCESSES = 2
JOIN_TIMEOUT = 120.0


def _run(store: tuple[str, dict[str, Any]], ledger: Path) -> None:
    url, options = store
    spec = ScheduleSpec(url=url, ledger=str(ledger), broker_options=options)
    ready = SPAWN.Barrier(PROCESSES)
    children = [SPAWN.Process(target=serve, args=(spec, ready)) for _ in range(PROCESSES)]
    for child in children:
        child.start()
    for child in children:
        child.join(JOIN_TIMEOUT)
    assert [child.exitcode for child in children] == [0] * PROCESSES


def _stored_keys(store: tuple[str, dict[str, Any]]) -> list[str]:
    url, options = store
    broker = open_broker(url, **options)
    try:
        return [t.business_key or "" for t in broker.list(Filter(type=TYPE))]
    finally:
        broker.close()


def _tick(key: str) -> datetime:
    return datetime.fromisoformat(key.removeprefix(f"schedule:{NAME}:"))


def test_two_processes_make_one_task_per_tick(store: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "ledger"))
    _run(store, tmp_path / "ledger")
    keys = _stored_keys(store)
    assert len(keys) == len(set(keys)) >= 3
    ticks = sorted(_tick(key) for key in keys)
    every_second = [ticks[0] + timedelta(seconds=n) for n in range(len(ticks))]
    assert ticks == every_second, "a tick was skipped"
    entries = ledger.entries()
    created = Counter(e.task_id for e in entries if e.event == "created")
    assert created == Counter(keys), "each stored task was made by exactly one process"
    handled: dict[int, set[str]] = {}
    for entry in entries:
        handled.setdefault(entry.pid, set()).add(entry.task_id)
    assert len(handled) == PROCESSES
    both = set.intersection(*handled.values())
    assert len(both) >= 2, "the processes ticked together for a few seconds"
    existed = Counter(e.task_id for e in entries if e.event == "existed")
    assert all(existed[key] == 1 for key in both), "the other process found each shared tick's task"
    assert {tick_key(NAME, t) for t in ticks} == set(keys)
