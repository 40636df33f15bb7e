"""The connection the broker keeps checked out for its hottest writes, taken in turn.

Checking a connection out of the pool and back in around each call costs SQLAlchemy a new
`Connection`, the pool's bookkeeping and, for a call in autocommit, switching the driver's
autocommit on and back off: on PostgreSQL a fifth to a half of a one-statement call's time in
this process, on SQLite two thirds of an empty write transaction. Here one connection stays
checked out and the calls take turns on it; a call that finds it busy takes a pooled one as
before, so calls in several threads never wait for each other here.

`SQLBroker` keeps ONE: on PostgreSQL in autocommit, for its one-statement calls (a claim, a
single submit, a read; the split calls of `taskgate.brokers.sql.pg_split` take it too), on
SQLite and MySQL for its write transactions (``transactions=True``). Everything else runs on
the pool: a second held connection (one for PostgreSQL's write transactions, MySQL's spare
writer and its autocommit statements, SQLite's reads) paid less than 10 % of
``process_in_process(workers=10)`` each when measured, and was retired (issue 34).

A held connection is detached from the pool (`Connection.detach`): it is one connection beyond
the pool's size, as the PostgreSQL wake-up listener's is, and never counts against the
connections the pool lends out. Like a pooled one it is pinged before use after
`taskgate.brokers.sql.engine.PING_AFTER_IDLE` seconds idle, and a dead one is replaced. A
forked child never touches its parent's connection (`taskgate.forks`: closing the
inherited copy would end the parent's session on the server); it opens its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from sqlalchemy import Connection, Engine

from taskgate import forks
from taskgate.brokers.sql import engine as engine_settings

__all__ = ["HeldConnection"]


class HeldConnection:
    """``use()``: the held connection when free, else one of ``engine``'s pool.

    ``transactions``: each use runs in a transaction (committed on a normal exit, rolled back
    on an error), else in autocommit (``engine`` an autocommit option view, for the pool).
    """

    def __init__(self, engine: Engine, *, transactions: bool) -> None:
        self._engine = engine
        self.transactions = transactions
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._idle_since = 0.0
        self._closed = False
        # What callers keep for the connection's server session (statements prepared on it):
        # emptied whenever another connection takes its place.
        self.session: dict[str, object] = {}

    @contextmanager
    def use(self) -> Iterator[Connection]:
        """A connection for one call; given back (kept, or returned to the pool) on exit."""
        if self._closed or not self._lock.acquire(blocking=False):
            with self._pooled() as pooled:
                yield pooled
            return
        try:
            conn = self._ready()
            try:
                if self.transactions:
                    with conn.begin():
                        yield conn
                else:
                    yield conn
            finally:
                self._put_back(conn)
        finally:
            self._lock.release()

    def _pooled(self) -> AbstractContextManager[Connection]:
        return self._engine.begin() if self.transactions else self._engine.connect()

    def take(self) -> Connection | None:
        """The held connection for a call that may neither wait nor open one (on an event loop):
        taken until `give_back`. None when it is busy, closed, not opened yet, idle long enough
        to be pinged first: the caller then uses `use` in a thread.
        """
        if self._conn is None or not self._lock.acquire(blocking=False):
            return None
        conn = self._conn
        idle = time.monotonic() - self._idle_since
        if conn is None or self._closed or idle >= engine_settings.PING_AFTER_IDLE:
            self._lock.release()
            return None
        return conn

    def give_back(self, conn: Connection) -> None:
        """End a `take`: the connection is kept, or discarded when it was invalidated."""
        try:
            self._put_back(conn)
        finally:
            self._lock.release()

    def close(self) -> None:
        """Close the held connection; later calls use the pool. A call on it closes it after."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._discard()
            finally:
                self._lock.release()

    def _ready(self) -> Connection:
        """The held connection, opened on first use, pinged after an idle spell."""
        conn = self._conn
        if conn is not None and conn.invalidated:
            # Never reconnected in place: SQLAlchemy would open a new driver connection
            # without the autocommit set below, and a statement meant to commit itself would
            # wait, uncommitted, in a transaction nobody ends.
            self._discard()
            conn = None
        if conn is not None and time.monotonic() - self._idle_since >= engine_settings.PING_AFTER_IDLE:
            if not _alive(conn):
                self._discard()
                conn = None
        if conn is None:
            conn = self._engine.connect()
            if not self.transactions:
                # Set on the connection itself: an option view of an app's engine that is an
                # option view already keeps the inner view's isolation level (SQLAlchemy 2.0),
                # and a statement meant to commit itself would wait in an open transaction.
                conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.detach()
            self._conn = conn
        return conn

    def _put_back(self, conn: Connection) -> None:
        if conn.in_transaction() and not conn.invalidated:
            # In autocommit: SQLAlchemy's own autobegun marker (the statements are committed).
            # In a transaction: left open by an error in the commit itself.
            try:
                conn.rollback()
            except Exception:
                if not conn.invalidated:
                    raise
                # The rollback found the connection dead (SQLAlchemy invalidated it): it is
                # discarded below, and the call's own outcome or error stands.
        if self._closed or conn.invalidated:
            self._discard()  # an error found the connection dead: the next call opens another
        else:
            self._idle_since = time.monotonic()

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        self.session = {}
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a dead connection may fail to close: it is gone either way
                pass

    def after_fork_in_child(self) -> None:
        """In a forked child: set the parent's connection aside, never closed; the next call
        opens one of this process's own."""
        if self._conn is not None:
            forks.keep_inherited(self._conn)
        self._conn = None
        self.session = {}
        self._lock = threading.Lock()  # the parent's may have been held by one of its threads


def _alive(conn: Connection) -> bool:
    """Ping ``conn``; False when it fails (dropped by the server or the network)."""
    dbapi_connection = conn.connection.dbapi_connection
    if dbapi_connection is None:
        return False
    try:
        conn.dialect.do_ping(dbapi_connection)
    except Exception:  # whatever the ping met, this connection is not used again
        return False
    return True
