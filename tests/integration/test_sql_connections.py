"""Pooled connections: pinged only after being idle, and a dead idle one is replaced unseen;
what a call sends on its connection (libpq's protocol trace, ``PQtrace``)."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from gate_helpers import GUARD
from psycopg import pq
from sqlalchemy import Connection, create_engine, event, func, select, text

from taskgate.brokers.base import QuotaSpec
from taskgate.brokers.params import QueueQuery, QueueState
from taskgate.brokers.sql import SQLBroker, dialects
from taskgate.brokers.sql import engine as engine_module
from taskgate.brokers.sql.engine import normalize_url
from taskgate.errors import TaskExistsError
from taskgate.task import Filter, Status
from taskgate.testing import steps
from taskgate.testing.contract._support import claim_one, new_task

QUOTA = QuotaSpec("budget", 10, timedelta(hours=1))


def _kill_other_sessions(url: str) -> int:
    admin = create_engine(normalize_url(url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).all()
            )
    finally:
        admin.dispose()


def test_a_connection_killed_while_idle_is_replaced_before_use(postgresql_url, monkeypatch):
    broker = SQLBroker(postgresql_url)
    try:
        (task,) = steps.enqueue(broker, [new_task()])
        assert _kill_other_sessions(postgresql_url) >= 1
        monkeypatch.setattr(engine_module, "PING_AFTER_IDLE", 0.0)  # every pooled one is "idle"
        assert broker.get(task.id).id == task.id
    finally:
        broker.close()


def test_a_connection_back_in_use_at_once_is_not_pinged(postgresql_url):
    broker = SQLBroker(postgresql_url)
    dialect = broker._engine.dialect
    pings: list[object] = []
    real_ping = dialect.do_ping
    dialect.do_ping = lambda conn: pings.append(conn) or real_ping(conn)  # type: ignore[method-assign]
    try:
        steps.enqueue(broker, [new_task()])
        lease = claim_one(broker)
        steps.ack(broker, lease.task.id, lease.token, None)
        assert pings == []
    finally:
        broker.close()


def test_a_claim_commits_without_waiting_for_the_disk_and_the_connection_keeps_waiting(postgresql_url):
    """Only the claim's own transaction skips the WAL flush wait; the pooled connection does not."""
    engine = create_engine(normalize_url(postgresql_url), pool_size=1, max_overflow=0)
    broker = SQLBroker(engine)
    settings: list[str] = []

    def record(conn, cursor, statement, *_):
        if "set_config" in statement:
            settings.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        steps.enqueue(broker, [new_task(), new_task()])
        lease = claim_one(broker)
        with engine.connect() as conn:  # the one pooled connection the claim just used
            assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == "on"
        steps.ack(broker, lease.task.id, lease.token, None)
        claim_one(broker)
        assert len(settings) == 2  # each claim switches its own commit, and only claims do
        with engine.begin() as conn:
            row = conn.execute(
                select(
                    dialects.PostgreSQLTraits().commit_without_flush_wait().label("set"),  # type: ignore[union-attr]
                    func.current_setting("synchronous_commit").label("now"),
                )
            ).one()
            assert (row.set, row.now) == ("off", "off")
        with engine.connect() as conn:
            assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == "on"
    finally:
        broker.close()
        engine.dispose()


def _flights(broker: SQLBroker, call: Callable[[], object]) -> list[list[str]]:
    """The frontend messages ``call`` sends, per flight, on any of the broker's connections: its
    held one (`taskgate.brokers.sql.held`) and the pool's one."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "trace"
        with path.open("w") as sink:
            # The held one first: it is taken out of the pool (of one connection) on first use.
            assert broker._held is not None
            with broker._held.use() as held, broker._engine.connect() as pooled:
                pgconns = [conn.connection.dbapi_connection.pgconn for conn in (held, pooled)]  # type: ignore[union-attr]
            for pgconn in pgconns:
                pgconn.trace(sink.fileno())
                pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                call()
            finally:
                for pgconn in pgconns:
                    pgconn.untrace()
        lines = path.read_text().splitlines()
    messages: list[str] = []  # a message's SQL goes on over the lines after its first
    for line in lines:
        if line.startswith(("F\t", "B\t")) or not messages:
            messages.append(line)
        else:
            messages[-1] += "\n" + line
    flights: list[list[str]] = [[]]
    for message in messages:
        if message.startswith("F\t"):
            flights[-1].append(message)
            if message.split("\t")[2].split(" ")[0] in ("Sync", "Query"):
                flights.append([])
    return [flight for flight in flights if flight]


def test_reads_on_postgresql_are_one_round_trip_each(postgresql_url):
    """A read of one statement needs no BEGIN and COMMIT: the SELECT is all that goes out."""
    engine = create_engine(normalize_url(postgresql_url), pool_size=1, max_overflow=0)
    broker = SQLBroker(engine)
    try:
        (task,) = steps.enqueue(broker, [new_task(business_key="k")])
        reads: dict[str, Callable[[], object]] = {
            "get": lambda: broker.get(task.id),
            "list": lambda: broker.list(Filter(queue="q", limit=5)),
            "history": lambda: steps.history(broker, "k"),
            "counts": broker.counts,
            "queue_state": lambda: steps.queue_length(broker, "q"),
            "queue_state with a quota": lambda: broker.queue_state(QueueQuery("q", QUOTA)),
        }
        answers: dict[str, object] = {}
        for name, read in reads.items():
            flights = _flights(broker, lambda name=name, read=read: answers.update({name: read()}))
            assert len(flights) == 1, name
            assert "SELECT" in flights[0][0] and "BEGIN" not in flights[0][0], name
        assert answers["get"] == task and answers["list"] == [task] and answers["history"] == [task]
        assert answers["queue_state"] == 1
        with_quota = answers["queue_state with a quota"]
        assert isinstance(with_quota, QueueState) and with_quota.queue_len == 1
        assert with_quota.quota is not None and (with_quota.quota.used, with_quota.quota.limit) == (0, 10)
    finally:
        broker.close()
        engine.dispose()


def test_a_submit_with_a_business_key_on_postgresql_is_one_round_trip(postgresql_url):
    """The task row, its key's row and the wake-up go in one statement; a second submit of
    the key changes nothing and names the first (its checks run after the statement failed)."""
    engine = create_engine(normalize_url(postgresql_url), pool_size=1, max_overflow=0)
    broker = SQLBroker(engine)
    try:
        steps.enqueue_statuses(broker, [new_task()])  # the first call samples the server's clock
        first = new_task(business_key="order-1")
        flights = _flights(broker, lambda: steps.enqueue_statuses(broker, [first]))
        assert len(flights) == 1
        assert "INSERT INTO taskgate_business_keys" in flights[0][0]
        assert [task.id for task in steps.history(broker, "order-1")] == [first.id]

        with pytest.raises(TaskExistsError) as caught:
            steps.enqueue_statuses(broker, [new_task(business_key="order-1")])
        assert caught.value.execution_id == first.id
        assert broker.counts()["t"][Status.PENDING] == 2
    finally:
        broker.close()
        engine.dispose()


def test_a_child_of_waiting_parents_on_postgresql_is_one_round_trip(postgresql_url):
    engine = create_engine(normalize_url(postgresql_url), pool_size=1, max_overflow=0)
    broker = SQLBroker(engine)
    try:
        first, second = steps.enqueue(broker, [new_task(), new_task()])
        child = new_task(depends_on=(second.id, first.id, second.id))  # a parent named twice
        flights = _flights(broker, lambda: steps.enqueue_statuses(broker, [child]))
        assert len(flights) == 1
        assert broker.get(child.id).status is Status.BLOCKED
        assert broker.get(child.id).depends_on == (second.id, first.id, second.id)
        for lease in steps.claim(broker, "q", 2, timedelta(seconds=30)):
            steps.ack(broker, lease.task.id, lease.token, None)
        assert broker.get(child.id).status is Status.PENDING  # its edges went in with it
    finally:
        broker.close()
        engine.dispose()


def test_a_child_submitted_while_its_parent_is_being_finished_waits_and_arrives_pending(postgresql_url):
    """The submit share-locks the parents: a parent row locked by a transaction that finishes
    it makes the submit wait, then see the parent completed (never a child left blocked by a
    parent that settled its children before the child was committed)."""
    broker = SQLBroker(postgresql_url)
    holder = create_engine(normalize_url(postgresql_url))
    try:
        (parent,) = steps.enqueue(broker, [new_task()])
        child = new_task(depends_on=(parent.id,))
        outcome: list[object] = []
        with holder.connect() as other:
            other.execute(
                text("UPDATE taskgate_tasks SET status = 'completed', ready = false WHERE id = :id"),
                {"id": parent.id},
            )
            submitter = threading.Thread(
                target=lambda: outcome.append(steps.enqueue_statuses(broker, [child]))
            )
            submitter.start()
            _wait_for_a_lock_wait(other)
            other.commit()
        submitter.join(GUARD)
        assert outcome == [[Status.PENDING]]
        assert broker.get(child.id).status is Status.PENDING
    finally:
        holder.dispose()
        broker.close()


def _wait_for_a_lock_wait(conn: Connection) -> None:
    """Until another session of this database waits for a row lock (at most `GUARD` s)."""
    deadline = time.monotonic() + GUARD
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
    )
    while conn.execute(query).scalar_one() == 0:
        assert time.monotonic() < deadline, "the submit never waited for the parent's lock"
        time.sleep(0.005)  # polling another session's state: no event to wait on
