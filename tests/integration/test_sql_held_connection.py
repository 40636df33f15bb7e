"""The connection a PostgreSQL broker holds for its one-statement calls (`taskgate.brokers.sql.held`):
outside the pool, shared in turn, replaced when dead, never touched by a forked child, closed
with the broker."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import pytest
from gate_helpers import GUARD
from sqlalchemy import Engine, create_engine, text

from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql import engine as engine_module
from taskgate.brokers.sql.engine import normalize_url
from taskgate.errors import BrokerError
from taskgate.task import Status
from taskgate.testing.contract._support import new_task


def _one_connection_engine(url: str) -> Engine:
    return create_engine(normalize_url(url), pool_size=1, max_overflow=0, pool_timeout=2)


def _held_pid(broker: SQLBroker) -> int:
    with broker._autocommit.connect() as held:
        return int(held.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def _sessions(url: str) -> set[int]:
    admin = create_engine(normalize_url(url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            query = (
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return {int(pid) for (pid,) in conn.execute(text(query))}
    finally:
        admin.dispose()


def _terminate(url: str, pid: int) -> None:
    admin = create_engine(normalize_url(url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
        deadline = time.monotonic() + GUARD
        while pid in _sessions(url):
            assert time.monotonic() < deadline, f"session {pid} outlived its termination"
            time.sleep(0.005)  # another server process's exit: nothing to wait on but its row
    finally:
        admin.dispose()


def test_one_statement_calls_go_through_while_transactions_hold_the_whole_pool(postgresql_url):
    """The held connection is not the pool's: with the pool's one connection lent out, a
    submit, a read and a claim still go through (a pooled checkout would time out)."""
    engine = _one_connection_engine(postgresql_url)
    broker = SQLBroker(engine)
    try:
        (task,) = broker.enqueue([new_task()])
        with engine.connect() as lent:  # the pool's only connection, in use elsewhere
            lent.execute(text("SELECT 1"))
            assert broker.get(task.id).status is Status.PENDING
            broker.enqueue_quiet([new_task()])
            assert len(broker.claim("q", 2, timedelta(seconds=30))) == 2
    finally:
        broker.close()
        engine.dispose()


def test_calls_take_turns_on_one_session_and_a_busy_one_sends_the_call_to_the_pool(postgresql_url):
    engine = _one_connection_engine(postgresql_url)
    broker = SQLBroker(engine)
    try:
        (task,) = broker.enqueue([new_task(), new_task()])[:1]
        held = _held_pid(broker)
        broker.get(task.id)
        broker.claim("q", 1, timedelta(seconds=30))
        assert _held_pid(broker) == held  # the same session, call after call

        answers: list[object] = []
        with broker._autocommit.connect():  # the held connection busy (in another call)
            reader = threading.Thread(target=lambda: answers.append(broker.get(task.id).id))
            reader.start()
            reader.join(GUARD)
            assert answers == [task.id]  # did not wait for the held connection: took the pool's
        assert _held_pid(broker) == held
    finally:
        broker.close()
        engine.dispose()


def test_a_held_connection_killed_while_in_use_fails_one_call_and_is_replaced(postgresql_url):
    """Back in use within `PING_AFTER_IDLE` it is not pinged (as a pooled one would not be):
    the call that finds it dead fails with `BrokerError`; the next one opens another."""
    broker = SQLBroker(postgresql_url)
    try:
        (task,) = broker.enqueue([new_task()])
        dead = _held_pid(broker)
        _terminate(postgresql_url, dead)
        with pytest.raises(BrokerError):
            broker.get(task.id)
        assert broker.get(task.id).id == task.id
        assert _held_pid(broker) != dead
        assert broker._engine.pool.checkedout() == 0  # the new one is held outside the pool too
    finally:
        broker.close()


def test_a_held_connection_killed_while_idle_is_replaced_before_use(postgresql_url, monkeypatch):
    broker = SQLBroker(postgresql_url)
    try:
        (task,) = broker.enqueue([new_task()])
        dead = _held_pid(broker)
        _terminate(postgresql_url, dead)
        monkeypatch.setattr(engine_module, "PING_AFTER_IDLE", 0.0)  # every connection is "idle"
        assert broker.get(task.id).id == task.id
        assert _held_pid(broker) != dead
    finally:
        broker.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents_session_alone(postgresql_url):
    broker = SQLBroker(postgresql_url)
    try:
        (task,) = broker.enqueue([new_task()])
        parent_session = _held_pid(broker)
        child = os.fork()
        if child == 0:  # pragma: no cover -- the child reports through its exit status
            code = 1
            try:
                broker._engine.dispose(close=False)  # SQLAlchemy's advice for a forked child's pool
                if broker.get(task.id).id == task.id and _held_pid(broker) != parent_session:
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert broker.get(task.id).id == task.id  # the parent's session was not ended by the child
        assert _held_pid(broker) == parent_session
    finally:
        broker.close()


def test_closing_the_broker_ends_the_held_session(postgresql_url):
    broker = SQLBroker(postgresql_url)
    (task,) = broker.enqueue([new_task()])
    held = _held_pid(broker)
    assert held in _sessions(postgresql_url)
    broker.close()
    deadline = time.monotonic() + GUARD
    while held in _sessions(postgresql_url):
        assert time.monotonic() < deadline, "the held session outlived the broker"
        time.sleep(0.005)  # the server process's exit: nothing to wait on but its row
    with pytest.raises(BrokerError):
        broker.get(task.id)
