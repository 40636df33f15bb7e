"""PostgreSQL: a batch of acks is one transaction with the settling of its children, and
survives its connection's loss (the next batch gets a new one)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest
from sqlalchemy import Engine, create_engine, text

from taskgate.brokers.params import Complete, ItemAnswer, Settle
from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.engine import normalize_url
from taskgate.errors import BrokerError
from taskgate.task import Status
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task

LEASE = timedelta(seconds=60)


def _ack_quietly(broker: SQLBroker, items: Sequence[tuple[str, str, bytes | None]]) -> list[ItemAnswer]:
    """The acks as the runtime's group commit writes them: one settle, no snapshots."""
    return broker.settle(Settle(tuple(Complete(*item) for item in items), snapshots=False))


def _one_connection_broker(url: str, **connect_args: str) -> tuple[SQLBroker, Engine]:
    engine = create_engine(normalize_url(url), pool_size=1, max_overflow=0, connect_args=connect_args)
    return SQLBroker(engine), engine


def test_a_failed_children_lookup_undoes_the_completion_before_it(postgresql_url):
    """The lookup runs after the statement that completed the parent; if it fails, that
    completion is rolled back with it: the parent still holds its lease, the child is still
    blocked, and acking again later settles both."""
    broker, engine = _one_connection_broker(postgresql_url, options="-c lock_timeout=200")
    holder = create_engine(normalize_url(postgresql_url))
    try:
        (parent,) = steps.enqueue(broker, [new_task()])
        (child,) = steps.enqueue(broker, [new_task(depends_on=(parent.id,))])
        (lease,) = steps.claim(broker, "q", 1, LEASE)
        item = (parent.id, lease.token, None)
        with holder.connect() as other:
            other.execute(text("SELECT id FROM taskgate_tasks WHERE id = :id FOR UPDATE"), {"id": child.id})
            with pytest.raises(BrokerError, match="lock timeout"):
                _ack_quietly(broker, [item])
            assert broker.get(parent.id).status is Status.RUNNING
            assert broker.get(child.id).status is Status.BLOCKED
            other.rollback()

        assert _ack_quietly(broker, [item]) == [None]
        assert broker.get(parent.id).status is Status.COMPLETED
        assert broker.get(child.id).status is Status.PENDING
    finally:
        holder.dispose()
        broker.close()
        engine.dispose()


def test_a_batch_of_acks_on_a_lost_connection_fails_and_the_next_one_goes_through(postgresql_url):
    broker, engine = _one_connection_broker(postgresql_url)
    admin = create_engine(normalize_url(postgresql_url), isolation_level="AUTOCOMMIT")
    try:
        steps.enqueue(broker, [new_task() for _ in range(2)])
        items = [(lease.task.id, lease.token, None) for lease in steps.claim(broker, "q", 2, LEASE)]
        steps.enqueue(broker, [new_task() for _ in range(2)])  # on the writes' held connection
        assert broker._held_writes is not None
        with broker._held_writes.use() as writes:
            writer_pid = writes.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": writer_pid})
        # Just used, so not pinged before the acks: the batch finds it dead.
        with pytest.raises(BrokerError):
            _ack_quietly(broker, items)

        assert _ack_quietly(broker, items) == [None, None]
        assert {broker.get(task_id).status for task_id, _, _ in items} == {Status.COMPLETED}
    finally:
        admin.dispose()
        broker.close()
        engine.dispose()
