"""The connections an SQL broker keeps for its hottest calls (`taskgate.brokers.sql.held`):
PostgreSQL's and MySQL's one-statement calls in autocommit, every backend's write transactions
(on MySQL on two), SQLite's reads. Outside the pool, taken in turn, replaced when dead, closed
with the broker. (A forked child's: test_sql_fork.py.)"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from gate_helpers import GUARD
from sql_sessions import held_session, hot
from sqlalchemy import create_engine, event, text

from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql import engine as engine_module
from taskgate.brokers.sql.engine import driver_connection, normalize_url
from taskgate.brokers.sql.prepared import traced
from taskgate.errors import BrokerError
from taskgate.task import Filter, Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task

LEASE = timedelta(seconds=30)


def test_each_backend_holds_a_connection_for_its_writes_and_servers_one_for_statements(sql_server):
    broker = SQLBroker(sql_server.url)
    try:
        assert broker._held_writes is not None and broker._held_writes.transactions
        if sql_server.session_query is not None:  # PostgreSQL's one-statement calls, MySQL's lone INSERT
            assert broker._held_statements is not None and not broker._held_statements.transactions
            assert held_session(broker, sql_server, broker._held_statements) != held_session(
                broker, sql_server, broker._held_writes
            )
        else:  # every call is a transaction
            assert broker._held_statements is None
    finally:
        broker.close()


def _commits(broker: SQLBroker) -> list[None]:
    """One entry per COMMIT the broker's connections send from now on."""
    sent: list[None] = []
    event.listen(broker._engine, "commit", lambda conn: sent.append(None))
    return sent


def _rollbacks(broker: SQLBroker) -> list[None]:
    sent: list[None] = []
    event.listen(broker._engine, "rollback", lambda conn: sent.append(None))
    return sent


def test_sqlite_reads_run_on_a_held_connection_in_read_only_transactions(tmp_path: Path):
    """No pool checkout per read once it is open; a read finding it busy takes a pooled one. An
    in-memory database (one shared connection) holds none."""
    broker = SQLBroker(f"sqlite:///{tmp_path / 'tasks.db'}")
    try:
        (task,) = steps.enqueue(broker, [new_task(business_key="k")])
        broker.get(task.id)  # opens it
        checkouts: list[None] = []
        event.listen(broker._engine.pool, "checkout", lambda *args: checkouts.append(None))
        assert broker.get(task.id) == task
        assert broker.list(Filter(queue="q")) == [task]
        assert steps.history(broker, "k") == [task]
        assert broker.queue_length("q") == 1
        assert checkouts == []
        held = broker._held_reads
        assert held is not None and held.transactions
        with held.use():  # busy, in another call
            assert broker.get(task.id) == task
        assert len(checkouts) == 1
    finally:
        broker.close()
    assert broker._held_reads is not None and broker._held_reads._conn is None  # closed with it
    memory = SQLBroker("sqlite://")
    try:
        assert memory._held_reads is None
    finally:
        memory.close()


def test_mysql_overlapping_write_transactions_run_on_two_held_connections(mysql_url):
    """A claim and an ack overlap in every cycle of a busy queue: the second write transaction
    runs on a spare held connection, and only a third goes to the pool (whose return would
    cost a ROLLBACK round trip)."""
    broker = SQLBroker(mysql_url)
    try:
        steps.enqueue(broker, [new_task() for _ in range(4)])
        claimed: list[int] = []

        def claim_in_a_thread() -> None:
            worker = threading.Thread(target=lambda: claimed.append(len(steps.claim(broker, "q", 1, LEASE))))
            worker.start()
            worker.join(GUARD)

        held, spare = broker._held_writes, broker._spare_writes
        assert held is not None and spare is not None
        with held.use():
            claim_in_a_thread()  # opens the spare (a checkout, then detached from the pool)
        checkouts: list[None] = []
        event.listen(broker._engine.pool, "checkout", lambda *args: checkouts.append(None))
        with held.use():  # a write transaction in flight
            claim_in_a_thread()
            assert claimed == [1, 1] and checkouts == []  # on the spare
            with spare.use():  # and a second one
                claim_in_a_thread()
        assert claimed == [1, 1, 1] and len(checkouts) == 1
    finally:
        broker.close()


def test_mysql_stores_a_plain_single_task_by_its_insert_alone(mysql_url):
    """In autocommit the INSERT commits itself: no COMMIT round trip. A task with a business key
    (two rows) is still stored in a transaction."""
    broker = SQLBroker(mysql_url)
    try:
        steps.enqueue(broker, [new_task()])  # opens the held connections
        commits = _commits(broker)
        (plain,) = steps.enqueue(broker, [new_task()])
        assert commits == []
        (keyed,) = steps.enqueue(broker, [new_task(business_key="k")])
        assert len(commits) == 1
        assert broker.get(plain.id).status is Status.PENDING
        assert steps.history(broker, "k") == [keyed]
    finally:
        broker.close()


def test_mysql_reads_of_one_statement_run_in_autocommit_on_the_held_connection(mysql_url):
    """A read costs its statement alone: no COMMIT or ROLLBACK after it."""
    broker = SQLBroker(mysql_url)
    try:
        (task,) = steps.enqueue(broker, [new_task(business_key="k")])
        broker.get(task.id)
        commits, rollbacks = _commits(broker), _rollbacks(broker)
        assert broker.get(task.id) == task
        assert broker.list(Filter(queue="q")) == [task]
        assert steps.history(broker, "k") == [task]
        assert broker.queue_length("q") == 1
        assert commits == [] and rollbacks == []
    finally:
        broker.close()


def test_mysql_a_read_finding_the_held_connection_busy_runs_in_a_transaction(mysql_url):
    broker = SQLBroker(mysql_url)
    try:
        (task,) = steps.enqueue(broker, [new_task()])
        broker.get(task.id)
        commits = _commits(broker)
        held = broker._held_statements
        assert held is not None
        read: list[Task] = []
        with held.use():  # busy, in another call
            reader = threading.Thread(target=lambda: read.append(broker.get(task.id)))
            reader.start()
            reader.join(GUARD)
        assert read == [task] and len(commits) == 1
    finally:
        broker.close()


def test_mysql_a_lone_insert_through_an_apps_option_view_is_committed(mysql_url):
    """The app's engine an option view with an isolation level of its own: the broker's
    autocommit view of it would keep that level, and the INSERT would wait uncommitted."""
    app_engine = create_engine(normalize_url(mysql_url)).execution_options(isolation_level="REPEATABLE READ")
    broker = SQLBroker(app_engine)
    try:
        (task,) = steps.enqueue(broker, [new_task()])
        with app_engine.connect() as other:
            seen = other.execute(text("SELECT status FROM taskgate_tasks WHERE id = :id"), {"id": task.id})
            assert seen.scalar_one() == Status.PENDING.value
    finally:
        broker.close()
        app_engine.dispose()


def test_mysql_a_lone_insert_finding_the_held_connection_busy_runs_in_a_transaction(mysql_url):
    """Not on a pooled connection switched to autocommit and back (a round trip each way)."""
    broker = SQLBroker(mysql_url)
    try:
        steps.enqueue(broker, [new_task()])
        commits = _commits(broker)
        held = broker._held_statements
        assert held is not None
        stored: list[Task] = []
        with held.use():  # busy, in another call
            submitter = threading.Thread(target=lambda: stored.extend(steps.enqueue(broker, [new_task()])))
            submitter.start()
            submitter.join(GUARD)
        assert len(stored) == 1 and len(commits) == 1
        (task,) = stored
        assert broker.get(task.id).status is Status.PENDING
    finally:
        broker.close()


def test_hot_calls_go_through_while_the_pool_is_lent_out(sql_server):
    """The held connections are not the pool's: with the pool's one connection in use, a
    submit, a claim and an ack still go through (a pooled checkout would time out)."""
    engine = create_engine(normalize_url(sql_server.url), pool_size=1, max_overflow=0, pool_timeout=2)
    broker = SQLBroker(engine)
    try:
        # Each held connection is taken from the pool on first use: a single submit opens the
        # one for statements (PostgreSQL), a submit of two the one for write transactions.
        steps.enqueue(broker, [new_task()])
        steps.enqueue(broker, [new_task(), new_task()])
        with engine.connect() as lent:  # the pool's only connection, in use elsewhere
            lent.execute(text("SELECT 1"))
            steps.enqueue(broker, [new_task()])
            leases = steps.claim(broker, "q", 4, LEASE)
            assert len(leases) == 4
            assert steps.ack_many(broker, [(lease.task.id, lease.token, None) for lease in leases])
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
    ("call", "engine"),
    [("get", "owned"), ("enqueue", "owned"), ("traced get", "owned"), ("traced get", "the app's")],
)
def test_a_held_postgresql_connection_left_mid_request_fails_one_call_and_is_replaced(
    postgresql_url, call, engine
):
    """A session killed while a call's request was being sent can leave psycopg's connection
    neither closed nor broken, with libpq still owing a reply ("another command is already in
    progress"), so SQLAlchemy does not invalidate it. Seen once in CI, after
    ``pg_terminate_backend``; made here by sending a request whose reply is never read. The call
    that meets it fails; the connection is closed and replaced. ``get`` runs prepared on the
    driver's cursor, on the held connection for one-statement calls, and through SQLAlchemy
    when the engine traces its statements (the broker's own, or an app's); ``enqueue`` of two
    tasks is a write transaction on the other held connection."""
    app_engine = create_engine(normalize_url(postgresql_url))
    broker = SQLBroker(app_engine if engine == "the app's" else postgresql_url)
    try:
        if call == "traced get":
            event.listen(broker._engine, "before_cursor_execute", lambda *args: None)
        (task,) = steps.enqueue(broker, [new_task()])
        held = broker._held_writes if call == "enqueue" else broker._held_statements
        assert held is not None
        with held.use() as conn:
            stuck = driver_connection(conn)
            assert traced(conn) is (call == "traced get")
        stuck.pgconn.send_query(b"SELECT 1")  # its reply never read: the driver is mid-request

        def run() -> object:
            if call == "enqueue":
                return steps.enqueue(broker, [new_task(), new_task()])
            return broker.get(task.id)

        with pytest.raises(BrokerError):  # "another command is already in progress", or alike
            run()
        assert stuck.closed
        run()
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


def test_closing_the_broker_ends_theheld_session(networked_sql):
    broker = SQLBroker(networked_sql.url)
    (task,) = steps.enqueue(broker, [new_task()])
    helds = (broker._held_statements, broker._held_writes)
    held = {held_session(broker, networked_sql, h) for h in helds if h}
    assert held <= networked_sql.sessions()
    broker.close()
    for session in held:
        networked_sql.wait_gone(session, "the broker")
    with pytest.raises(BrokerError):
        broker.get(task.id)
