"""Four worker processes claim one queue of 2,000 tasks: each task is claimed exactly once."""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from taskgate.brokers.base import NewTask
from taskgate.brokers.sql import SQLBroker
from taskgate.task import Filter, Status
from taskgate.testing import steps

TASKS = 2000
WORKERS = 4
BATCH = 25

# A fresh, uniquely named PostgreSQL database per test (overlapping test runs cannot collide).


def claim_and_ack(url: str, start: Any, results: Any) -> None:
    """Worker process: claim batches and ack them until the queue is empty; report the ids."""
    broker = SQLBroker(url, poll_interval=0.05)
    claimed: list[str] = []
    try:
        start.wait(timeout=60)
        while True:
            leases = steps.claim(broker, "q", BATCH, timedelta(minutes=5))
            if not leases and steps.queue_length(broker, "q") == 0:
                break
            for lease in leases:
                steps.ack(broker, lease.task.id, lease.token, None)
                claimed.append(lease.task.id)
    finally:
        broker.close()
        results.put(claimed)


def run_workers(url: str) -> list[list[str]]:
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(WORKERS)
    results = context.Queue()
    workers = [context.Process(target=claim_and_ack, args=(url, start, results)) for _ in range(WORKERS)]
    for worker in workers:
        worker.start()
    claimed: list[list[str]] = []
    deadline = time.monotonic() + 90
    while len(claimed) < WORKERS and time.monotonic() < deadline:
        try:
            claimed.append(results.get(timeout=0.5))
        except queue_module.Empty:
            if not any(w.is_alive() for w in workers) and results.empty():
                break  # a worker died without reporting
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0, f"worker exited with {worker.exitcode}"
    assert len(claimed) == WORKERS, "a worker process did not report (crashed or deadlocked)"
    return claimed


def check_each_task_claimed_once(url: str) -> None:
    broker = SQLBroker(url)
    try:
        steps.enqueue(broker, [NewTask(id=f"task-{n:05d}", type="t", queue="q") for n in range(TASKS)])

        claimed = run_workers(url)

        every_claim = [task_id for ids in claimed for task_id in ids]
        assert len(every_claim) == TASKS, "a task was claimed twice or lost"
        assert set(every_claim) == {f"task-{n:05d}" for n in range(TASKS)}
        assert broker.counts() == {"t": {Status.COMPLETED: TASKS}}
        assert {task.claims for task in broker.list(Filter())} == {1}
    finally:
        broker.close()


@pytest.mark.slow
def test_sqlite_processes_sharing_a_file_claim_each_task_once(tmp_path: Path) -> None:
    check_each_task_claimed_once(f"sqlite:///{tmp_path / 'shared.db'}")


@pytest.mark.slow
def test_postgresql_processes_claim_each_task_once(postgresql_url: str) -> None:
    check_each_task_claimed_once(postgresql_url)


@pytest.mark.slow
def test_mysql_processes_claim_each_task_once(mysql_url: str) -> None:
    check_each_task_claimed_once(mysql_url)
