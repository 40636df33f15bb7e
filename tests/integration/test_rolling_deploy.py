"""A rolling deploy: a process without the handler of a new type never claims its tasks.

Two spawned processes share one store: the "old" one has a handler for type ``old`` only,
the "new" one for ``old`` and ``new``. Tasks of both types are submitted once both gates
run. Every ``new`` task must run in the new process, once, and none may fail -- the old
process, polling the same queue all along, leaves them to it.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from limits_worker import Ledger
from rolling_worker import QUEUE, RollingSpec, serve

from taskgate.brokers import open_broker
from taskgate.brokers.base import NewTask
from taskgate.task import Filter, Status, Task
from taskgate.testing import steps

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")
JOIN_TIMEOUT = 120.0
EACH = 20  # tasks of each type


def _submit(store: tuple[str, dict[str, Any]]) -> None:
    """``EACH`` tasks of each type, interleaved, the new type first."""
    url, options = store
    broker = open_broker(url, **options)
    try:
        tasks = [
            NewTask(id=f"{kind}-{i:02d}", type=kind, queue=QUEUE)
            for i in range(EACH)
            for kind in ("new", "old")
        ]
        steps.enqueue(broker, tasks)
    finally:
        broker.close()


def _stored(store: tuple[str, dict[str, Any]]) -> list[Task]:
    url, options = store
    broker = open_broker(url, **options)
    try:
        return broker.list(Filter(queue=QUEUE))
    finally:
        broker.close()


def test_an_old_process_leaves_a_new_type_to_the_process_with_its_handler(
    store: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    ledger = Ledger(str(tmp_path / "ledger"))
    url, options = store
    old = RollingSpec(url, ledger.path, handles=("old",), broker_options=options)
    new = RollingSpec(url, ledger.path, handles=("old", "new"), broker_options=options)
    ready, go = SPAWN.Barrier(3), SPAWN.Barrier(3)
    children = [SPAWN.Process(target=serve, args=(spec, ready, go)) for spec in (old, new)]
    for child in children:
        child.start()
    ready.wait(JOIN_TIMEOUT)  # both gates run: the old one is polling the queue already
    _submit(store)
    go.wait(JOIN_TIMEOUT)
    for child in children:
        child.join(JOIN_TIMEOUT)
    assert [child.exitcode for child in children] == [0, 0]  # no task failed in either

    old_pid, new_pid = (child.pid for child in children)
    started = [(e.task_id, e.pid) for e in ledger.entries() if e.event == "start"]
    assert sorted(task_id for task_id, pid in started if task_id.startswith("new")) == [
        f"new-{i:02d}" for i in range(EACH)
    ]
    assert {pid for task_id, pid in started if task_id.startswith("new")} == {new_pid}
    assert sorted(task_id for task_id, _ in started if task_id.startswith("old")) == [
        f"old-{i:02d}" for i in range(EACH)
    ]
    assert old_pid in {pid for _, pid in started}  # the old process was claiming all along
    tasks = _stored(store)
    assert {t.status for t in tasks} == {Status.COMPLETED}
    assert {t.claims for t in tasks} == {1}  # nobody claimed a task it could not run
