"""The one connection an SQL broker keeps for its hottest writes (`taskgate.brokers.sql.held`):
PostgreSQL's one-statement calls in autocommit, the write transactions elsewhere. Outside the
pool, taken in turn, replaced when dead, closed with the broker. (A forked child's:
test_sql_fork.py.)"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from gate_helpers import GUARD
from sql_sessions import held_session, hot
from sqlalchemy import create_engine, event, text

from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql import engine as engine_module
from taskgate.brokers.sql.engine import driver_connection, normalize_url
from taskgate.brokers.sql.prepared import traced
from taskgate.errors import BrokerError
from taskgate.task import Status
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task

LEASE = timedelta(seconds=30)


def test_each_backend_holds_one_connection_for_its_hottest_writes(sql_server):
    """PostgreSQL's claims and single submits are one statement each: its held connection is in
    autocommit. Elsewhere they are transactions. An in-memory SQLite database holds none (its
    one shared connection is all there is)."""
    broker = SQLBroker(sql_server.url)
    try:
        held = broker._held
        assert held is not None and held.transactions is (not broker._traits.dml_ctes)
        steps.enqueue(broker, [new_task()])
        steps.claim(broker, "q", 1, LEASE)
        assert broker._engine.pool.checkedout() == 0
    finally:
        broker.close()
    memory = SQLBroker("sqlite://")
    try:
        assert memory._held is None
    finally:
        memory.close()


def test_a_single_submit_through_an_apps_option_view_is_committed(networked_sql):
    """The app's engine an option view with an isolation level of its own: an autocommit view
    of it would keep that level (SQLAlchemy 2.0), and PostgreSQL's one-statement submit on the
    held connection would wait uncommitted."""
    engine = create_engine(normalize_url(networked_sql.url))
    app_engine = engine.execution_options(isolation_level="REPEATABLE READ")
    broker = SQLBroker(app_engine)
    try:
        (task,) = steps.enqueue(broker, [new_task()])
        with app_engine.connect() as other:
            seen = other.execute(text("SELECT status FROM taskgate_tasks WHERE id = :id"), {"id": task.id})
            assert seen.scalar_one() == Status.PENDING.value
    finally:
        broker.close()
        engine.dispose()


def test_hot_calls_go_through_while_the_pool_is_lent_out(sql_server):
    """The held connection is not the pool's: with the pool's one connection in use, a single
    submit and a claim still go through (a pooled checkout would time out), and so does an ack
    where it is a write transaction on the held connection (not on PostgreSQL, whose held
    connection is in autocommit: its transactions take pooled ones)."""
    engine = create_engine(normalize_url(sql_server.url), pool_size=1, max_overflow=0, pool_timeout=2)
    broker = SQLBroker(engine)
    try:
        steps.enqueue(broker, [new_task()])  # the held connection is taken from the pool on first use
        steps.enqueue(broker, [new_task(), new_task()])
        with engine.connect() as lent:  # the pool's only connection, in use elsewhere
            lent.execute(text("SELECT 1"))
            steps.enqueue(broker, [new_task()])
            leases = steps.claim(broker, "q", 4, LEASE)
            assert len(leases) == 4
            acks = [(lease.task.id, lease.token, None) for lease in leases]
            assert broker._held is not None
            if broker._held.transactions:
                assert steps.ack_many(broker, acks)
        if not broker._held.transactions:
            assert steps.ack_many(broker, acks)
    finally:
        broker.close()
        engine.dispose()


def test_calls_take_turns_on_one_session_and_a_busy_one_sends_the_call_to_the_pool(networked_sql):
    """(On SQLite the held connection's write transaction holds the file's one write lock, which
    another writer waits for whichever connection it is on.)"""
    sql_server = networked_sql
    broker = SQLBroker(sql_server.url)
    try:
        (task,) = steps.enqueue(broker, [new_task()])
        held = held_session(broker, sql_server)
        steps.enqueue(broker, [new_task()])
        steps.claim(broker, "q", 1, LEASE)
        assert held_session(broker, sql_server) == held  # the same session, call after call

        answers: list[object] = []
        with hot(broker).use():  # the held connection busy (in another call)
            submitter = threading.Thread(target=lambda: answers.append(steps.enqueue(broker, [new_task()])))
            submitter.start()
            submitter.join(GUARD)
            assert len(answers) == 1  # did not wait for the held connection: took a pooled one
        assert held_session(broker, sql_server) == held
        assert broker.get(task.id).status is Status.RUNNING
    finally:
        broker.close()


def test_a_held_connection_killed_while_in_use_fails_one_call_and_is_replaced(networked_sql):
    """Back in use within `PING_AFTER_IDLE` it is not pinged (as a pooled one would not be):
    the call that finds it dead fails with `BrokerError`; the next one opens another."""
    broker = SQLBroker(networked_sql.url)
    try:
        steps.enqueue(broker, [new_task()])
        dead = held_session(broker, networked_sql)
        networked_sql.terminate(dead)
        with pytest.raises(BrokerError):
            steps.enqueue(broker, [new_task()])
        steps.enqueue(broker, [new_task()])
        assert held_session(broker, networked_sql) != dead
        assert broker._engine.pool.checkedout() == 0  # the new one is held outside the pool too
        assert len(steps.claim(broker, "q", 3, LEASE)) == 2
    finally:
        broker.close()


@pytest.mark.parametrize(
    ("call", "engine"), [("get", "owned"), ("traced get", "owned"), ("traced get", "the app's")]
)
def test_a_held_postgresql_connection_left_mid_request_fails_one_call_and_is_replaced(
    postgresql_url, call, engine
):
    """A session killed while a call's request was being sent can leave psycopg's connection
    neither closed nor broken, with libpq still owing a reply ("another command is already in
    progress"), so SQLAlchemy does not invalidate it. Seen once in CI, after
    ``pg_terminate_backend``; made here by sending a request whose reply is never read. The call
    that meets it fails; the connection is closed and replaced. ``get`` runs prepared on the
    driver's cursor, on the held connection, and through SQLAlchemy when the engine traces its
    statements (the broker's own, or an app's)."""
    app_engine = create_engine(normalize_url(postgresql_url))
    broker = SQLBroker(app_engine if engine == "the app's" else postgresql_url)
    try:
        if call == "traced get":
            event.listen(broker._engine, "before_cursor_execute", lambda *args: None)
        (task,) = steps.enqueue(broker, [new_task()])
        held = broker._held
        assert held is not None
        with held.use() as conn:
            stuck = driver_connection(conn)
            assert traced(conn) is (call == "traced get")
        stuck.pgconn.send_query(b"SELECT 1")  # its reply never read: the driver is mid-request

        with pytest.raises(BrokerError):  # "another command is already in progress", or alike
            broker.get(task.id)
        assert stuck.closed
        broker.get(task.id)
        with held.use() as conn:
            assert driver_connection(conn) is not stuck
    finally:
        broker.close()
        app_engine.dispose()


def test_a_held_connection_killed_while_idle_is_replaced_before_use(networked_sql, monkeypatch):
    broker = SQLBroker(networked_sql.url)
    try:
        steps.enqueue(broker, [new_task()])
        dead = held_session(broker, networked_sql)
        networked_sql.terminate(dead)
        monkeypatch.setattr(engine_module, "PING_AFTER_IDLE", 0.0)  # every connection is "idle"
        steps.enqueue(broker, [new_task()])
        assert held_session(broker, networked_sql) != dead
    finally:
        broker.close()


def test_closing_the_broker_ends_the_held_session(networked_sql):
    broker = SQLBroker(networked_sql.url)
    (task,) = steps.enqueue(broker, [new_task()])
    held = held_session(broker, networked_sql)
    assert held in networked_sql.sessions()
    broker.close()
    networked_sql.wait_gone(held, "the broker")
    with pytest.raises(BrokerError):
        broker.get(task.id)
