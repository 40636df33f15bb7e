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
from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.engine import normalize_url
from taskgate.task import Status

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


@pytest.mark.parametrize("quiet", [False, True], ids=["ack_many", "ack_many_quiet"])
def test_an_ack_that_waited_for_a_childs_enqueue_wakes_that_child(
    postgresql_broker: tuple[SQLBroker, str], quiet: bool
) -> None:
    broker, url = postgresql_broker
    broker.enqueue([NewTask(id="parent", type="t", queue="q")])
    (lease,) = broker.claim("q", 1, TTL)
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as blocker, engine.connect() as watcher:
            # Hold the child's business key uncommitted: the child's enqueue then stops after
            # share-locking the parent and inserting the child and its edge.
            blocker.execute(
                text("INSERT INTO taskgate_business_keys (business_key, execution_id) VALUES ('k', 'parent')")
            )
            child = NewTask(id="child", type="t", queue="q", depends_on=("parent",), business_key="k")
            enqueue, enqueued = _in_thread(lambda: broker.enqueue([child]))
            _until(lambda: _lock_waiters(watcher) == 1)
            ack_many = broker.ack_many_quiet if quiet else broker.ack_many
            ack, acked = _in_thread(lambda: ack_many([("parent", lease.token, None)]))
            _until(lambda: _lock_waiters(watcher) == 2)  # the ack waits on the parent row
            blocker.rollback()  # the enqueue goes on and commits; then the ack goes on
            enqueue.join(GUARD)
            ack.join(GUARD)
    finally:
        engine.dispose()
    assert not isinstance(enqueued[0], Exception), enqueued
    assert enqueued[0][0].status is Status.BLOCKED  # the parent was still running
    assert acked[0] == [None] if quiet else acked[0][0].status is Status.COMPLETED
    assert broker.get("child").status is Status.PENDING, "the ack must see the child it waited for"
