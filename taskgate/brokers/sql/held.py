"""One autocommit connection kept open for the broker's one-statement calls.

A one-statement call (a PostgreSQL submit, claim or read) is one round trip, and checking a
connection out of the pool and back in around it was a fifth of the call's time in this
process: SQLAlchemy builds a `Connection`, sets the driver's autocommit on the way out and
resets it on the way back. Here one connection stays checked out, in autocommit, and the
calls take turns on it; a call that finds it busy takes a pooled one as before, so calls in
several threads never wait for each other here.

The connection is detached from the pool (`Connection.detach`): it is one connection beyond
the pool's size, as the wake-up listener's is, and never counts against the connections the
pool lends to transactions. Like a pooled one it is pinged before use after
`taskgate.brokers.sql.engine.PING_AFTER_IDLE` seconds idle, and a dead one is replaced. A
forked child never touches its parent's connection (closing the inherited copy would end the
parent's session on the server); it opens its own.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine

from taskgate.brokers.sql import engine as engine_settings

__all__ = ["HeldConnection"]

# Connections a forked child inherited: kept referenced, never closed, so that no finaliser
# ends the parent's session through the shared socket.
_INHERITED: list[Connection] = []


class HeldConnection:
    """``connect()``: the held autocommit connection when free, else one from ``engine``'s pool."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine  # an autocommit option view of the broker's engine
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._idle_since = 0.0
        self._pid = os.getpid()
        self._closed = False

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection in autocommit for one statement; returned (or kept) on exit."""
        if self._pid != os.getpid():
            self._forget_after_fork()
        if self._closed or not self._lock.acquire(blocking=False):
            with self._engine.connect() as pooled:
                yield pooled
            return
        try:
            conn = self._ready()
            try:
                yield conn
            finally:
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
        if conn is not None and time.monotonic() - self._idle_since >= engine_settings.PING_AFTER_IDLE:
            if not _alive(conn):
                self._discard()
                conn = None
        if conn is None:
            conn = self._engine.connect()
            conn.detach()
            self._conn = conn
        return conn

    def _put_back(self, conn: Connection) -> None:
        if conn.in_transaction():
            conn.rollback()  # SQLAlchemy's own autobegun marker; the statements are committed
        if self._closed or conn.invalidated:
            self._discard()  # an error found the connection dead: the next call opens another
        else:
            self._idle_since = time.monotonic()

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a dead connection may fail to close: it is gone either way
                pass

    def _forget_after_fork(self) -> None:
        if self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None
        self._lock = threading.Lock()  # the parent's may have been held by one of its threads
        self._pid = os.getpid()


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
