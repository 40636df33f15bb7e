"""PostgreSQL: a batch of acks sends its children lookup in the round trip of the ack itself.

Seen on the wire with libpq's own protocol trace (``PQtrace``) of the broker's one pooled
connection: a flight is what the client sends before it waits, ended by a ``Sync`` (extended
protocol) or a ``Query`` (simple protocol).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from psycopg import pq
from sqlalchemy import Engine, create_engine, text

from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.engine import normalize_url
from taskgate.errors import BrokerError
from taskgate.task import Status
from taskgate.testing.contract._support import new_task

LEASE = timedelta(seconds=60)


def _flights(engine: Engine, call: Callable[[], object]) -> list[list[str]]:
    """The frontend messages ``call`` sends on ``engine``'s one pooled connection, per flight."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "trace"
        with path.open("w") as sink:
            with engine.connect() as conn:
                pgconn = conn.connection.driver_connection.pgconn  # type: ignore[union-attr]
                pgconn.trace(sink.fileno())
                pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                call()
            finally:
                with engine.connect() as conn:
                    conn.connection.driver_connection.pgconn.untrace()  # type: ignore[union-attr]
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


def _one_connection_broker(url: str, **connect_args: str) -> tuple[SQLBroker, Engine]:
    engine = create_engine(normalize_url(url), pool_size=1, max_overflow=0, connect_args=connect_args)
    return SQLBroker(engine), engine


def test_a_batch_of_acks_looks_up_the_children_in_the_round_trip_of_the_ack(postgresql_url):
    broker, engine = _one_connection_broker(postgresql_url)
    try:
        broker.enqueue([new_task() for _ in range(3)])
        leases = broker.claim("q", 3, LEASE)
        items = [(lease.task.id, lease.token, None) for lease in leases]

        flights = _flights(engine, lambda: broker.ack_many_quiet(items))

        ack = [n for n, flight in enumerate(flights) if any("DELETE FROM" in m for m in flight)]
        lookup = [n for n, flight in enumerate(flights) if any("FOR NO KEY UPDATE" in m for m in flight)]
        assert len(ack) == 1
        assert ack == lookup[-1:]  # the lookup rides in the ack's flight
        # BEGIN (psycopg waits for it), the ack with the lookup, COMMIT.
        assert len(flights) == 3
        assert {broker.get(task_id).status for task_id, _, _ in items} == {Status.COMPLETED}
    finally:
        broker.close()
        engine.dispose()


def test_a_failed_children_lookup_undoes_the_ack_it_was_sent_with(postgresql_url):
    """The lookup is the second statement of the flight; if it fails, the parent's ack (the
    first, already run by the server) is rolled back with it: the parent still holds its lease,
    the child is still blocked, and acking again later settles both."""
    broker, engine = _one_connection_broker(postgresql_url, options="-c lock_timeout=200")
    holder = create_engine(normalize_url(postgresql_url))
    try:
        (parent,) = broker.enqueue([new_task()])
        (child,) = broker.enqueue([new_task(depends_on=(parent.id,))])
        (lease,) = broker.claim("q", 1, LEASE)
        item = (parent.id, lease.token, None)
        with holder.connect() as other:
            other.execute(text("SELECT id FROM taskgate_tasks WHERE id = :id FOR UPDATE"), {"id": child.id})
            with pytest.raises(BrokerError, match="lock timeout"):
                broker.ack_many_quiet([item])
            assert broker.get(parent.id).status is Status.RUNNING
            assert broker.get(child.id).status is Status.BLOCKED
            other.rollback()

        assert broker.ack_many_quiet([item]) == [None]
        assert broker.get(parent.id).status is Status.COMPLETED
        assert broker.get(child.id).status is Status.PENDING
    finally:
        holder.dispose()
        broker.close()
        engine.dispose()


def test_a_connection_lost_under_the_flight_is_replaced_and_the_acks_go_through_after(postgresql_url):
    broker, engine = _one_connection_broker(postgresql_url)
    admin = create_engine(normalize_url(postgresql_url), isolation_level="AUTOCOMMIT")
    try:
        broker.enqueue([new_task() for _ in range(2)])
        items = [(lease.task.id, lease.token, None) for lease in broker.claim("q", 2, LEASE)]
        with admin.connect() as conn:
            killed = conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).all()
        assert len(killed) == 1  # the broker's one pooled connection, just used: not pinged again
        with pytest.raises(BrokerError):
            broker.ack_many_quiet(items)

        assert broker.ack_many_quiet(items) == [None, None]
        assert {broker.get(task_id).status for task_id, _, _ in items} == {Status.COMPLETED}
    finally:
        admin.dispose()
        broker.close()
        engine.dispose()
