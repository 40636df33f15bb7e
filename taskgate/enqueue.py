"""`Gate.enqueue_in`'s application side: which transaction to write in, and who to tell when.

The task is written through the application's own SQLAlchemy `Session` or `Connection`, in the
transaction it has open (`taskgate.brokers.outbox.InTransaction`), so it is committed with the
application's commit and gone with its rollback. Workers in this process are told once the
commit is done -- a session's ``after_commit`` event; a bare connection's ``commit`` event,
which SQLAlchemy fires as it sends the COMMIT -- and never after a rollback. Other processes
learn of it from the store: PostgreSQL's NOTIFY, sent in the same transaction, is delivered
only if it commits; elsewhere their poll finds it.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, event
from sqlalchemy.orm import Session, SessionTransaction

from taskgate.brokers.base import Broker, NewTask
from taskgate.brokers.outbox import InTransaction
from taskgate.brokers.params import Submit
from taskgate.errors import ConfigError
from taskgate.task import Status

__all__ = ["enqueue_in", "in_transaction_broker"]

_WAKING = (Status.PENDING, Status.RETRYING)


def in_transaction_broker(broker: Broker) -> InTransaction:
    """``broker`` as an `InTransaction`; `ConfigError` when it cannot write in the app's transaction."""
    if broker.capabilities.in_app_transaction and isinstance(broker, InTransaction):
        return broker
    raise ConfigError(
        f"enqueue_in writes in the application's SQLAlchemy transaction, so it needs a SQL broker "
        f"(SQLBroker); {type(broker).__name__} does not declare capabilities.in_app_transaction"
    )


def enqueue_in(
    broker: InTransaction,
    session_or_connection: object,
    task: NewTask,
    *,
    max_pending: tuple[tuple[str, int], ...] = (),
) -> str:
    """Write ``task`` in the transaction of ``session_or_connection``; its id. ``max_pending``:
    `Submit.max_pending` (a full queue raises `QueueFullError`, nothing written)."""
    connection, on_commit = _transaction_of(session_or_connection)
    submitted = broker.submit_in(connection, Submit((task,), snapshots=False, max_pending=max_pending))
    if submitted.statuses[0] in _WAKING:
        queues = [task.queue]
        on_commit(lambda: broker.announce(queues))
    return task.id


def _transaction_of(target: object) -> tuple[Connection, Callable[[Callable[[], None]], None]]:
    """The connection to write on, and how to run something once its transaction committed."""
    if isinstance(target, Session):
        return target.connection(), lambda wake: _after_session_commit(target, wake)
    if isinstance(target, Connection):
        return target, lambda wake: _after_connection_commit(target, wake)
    if hasattr(target, "sync_session") or hasattr(target, "sync_connection"):
        raise TypeError(
            f"enqueue_in is not async: from an {type(target).__name__}, call it through run_sync, "
            "e.g. await session.run_sync(lambda s: gate.enqueue_in(s, 'type', payload))"
        )
    raise TypeError(
        f"enqueue_in needs a SQLAlchemy Session or Connection in a transaction, got {type(target).__name__}"
    )


# The wake-ups waiting for a transaction's end, kept in the session's or connection's ``info``;
# one pair of listeners per session or connection takes them (listeners cannot be removed
# while their event runs).
_WAKES = "taskgate_wakes_after_commit"


def _after_session_commit(session: Session, wake: Callable[[], None]) -> None:
    """Run ``wake`` after ``session``'s current transaction commits; forget it if it does not."""
    if not event.contains(session, "after_commit", _session_committed):
        event.listen(session, "after_commit", _session_committed)
        event.listen(session, "after_transaction_end", _session_ended)
    session.info.setdefault(_WAKES, []).append(wake)


def _session_committed(session: Session) -> None:
    if not session.in_nested_transaction():  # a SAVEPOINT released: nothing is committed yet
        for wake in session.info.pop(_WAKES, ()):
            wake()


def _session_ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the outermost: committed (its wakes ran already) or not
        session.info.pop(_WAKES, None)


def _after_connection_commit(connection: Connection, wake: Callable[[], None]) -> None:
    """Run ``wake`` as ``connection``'s transaction commits; forget it on a rollback."""
    if not event.contains(connection, "commit", _connection_committed):
        event.listen(connection, "commit", _connection_committed)
        event.listen(connection, "rollback", _connection_rolled_back)
    connection.info.setdefault(_WAKES, []).append(wake)


def _connection_committed(connection: Connection) -> None:
    for wake in connection.info.pop(_WAKES, ()):
        wake()


def _connection_rolled_back(connection: Connection) -> None:
    connection.info.pop(_WAKES, None)
