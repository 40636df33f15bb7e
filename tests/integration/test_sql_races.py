"""Races between a parent's completion and a child's enqueue, forced with real row locks.

A child enqueued while its parent is running share-locks the parent row; the parent's ack
must wait for that enqueue and then see the child, or the child stays blocked forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, text

from taskgate.brokers.base import NewTask
from taskgate.brokers.params import Complete, Settle
from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.engine import normalize_url
from taskgate.task import Status
from taskgate.testing import steps

TTL = timedelta(seconds=30)
GUARD = 20.0


@pytest.fixture
def postgresql_broker(postgresql_url: str) -> Iterator[tuple[SQLBroker, str]]:
    broker = SQLBroker(postgresql_url)
    yield broker, postgresql_url
    broker.close()


def _lock_waiters(conn: Connection) -> int:
    """Backends of this database waiting for a lock right now."""
    query = (
        "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE NOT l.granted AND a.datname = current_database()"
    )
    waiting = int(conn.execute(text(query)).scalar_one())
    conn.rollback()  # statistics views keep one snapshot per transaction
    return waiting


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD
    while not condition():
        assert time.monotonic() < deadline, "the expected lock wait never happened"
        time.sleep(0.005)


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


# The three ways an ack is written: alone with its snapshot (one task at a time), in a batch
# with snapshots, in a batch without (the group commit's): each must wait and see the child.
@pytest.mark.parametrize(
    ("quiet", "batch"),
    [(False, False), (False, True), (True, False)],
    ids=["ack", "ack_many", "ack_many_quiet"],
)
def test_an_ack_that_waited_for_a_childs_enqueue_wakes_that_child(
    postgresql_broker: tuple[SQLBroker, str], quiet: bool, batch: bool
) -> None:
    broker, url = postgresql_broker
    steps.enqueue(
        broker, [NewTask(id="parent", type="t", queue="q"), NewTask(id="other", type="t", queue="q")]
    )
    leases = {lease.task.id: lease for lease in steps.claim(broker, "q", 2, TTL)}
    acks = [Complete("parent", leases["parent"].token)]
    if batch:
        acks.append(Complete("other", leases["other"].token))
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as blocker, engine.connect() as watcher:
            # Hold the child's business key uncommitted: the child's enqueue then stops after
            # share-locking the parent and inserting the child and its edge.
            blocker.execute(
                text("INSERT INTO taskgate_business_keys (business_key, execution_id) VALUES ('k', 'parent')")
            )
            child = NewTask(id="child", type="t", queue="q", depends_on=("parent",), business_key="k")
            enqueue, enqueued = _in_thread(lambda: steps.enqueue(broker, [child]))
            _until(lambda: _lock_waiters(watcher) == 1)
            ack, acked = _in_thread(lambda: broker.settle(Settle(tuple(acks), snapshots=not quiet)))
            _until(lambda: _lock_waiters(watcher) == 2)  # the ack waits on the parent row
            blocker.rollback()  # the enqueue goes on and commits; then the ack goes on
            enqueue.join(GUARD)
            ack.join(GUARD)
    finally:
        engine.dispose()
    assert not isinstance(enqueued[0], Exception), enqueued
    assert enqueued[0][0].status is Status.BLOCKED  # the parent was still running
    assert not isinstance(acked[0], Exception), acked
    assert acked[0][0] is None if quiet else acked[0][0].status is Status.COMPLETED
    assert broker.get("child").status is Status.PENDING, "the ack must see the child it waited for"
