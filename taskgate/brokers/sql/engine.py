"""Engines for the SQL broker: URL defaults per database, and SQLite's write-transaction setup."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.pool import StaticPool

from taskgate.brokers import nowait
from taskgate.errors import ConfigError

__all__ = [
    "PACKET_TOO_LARGE",
    "PING_AFTER_IDLE",
    "SQLITE_BUSY_TIMEOUT",
    "closed_if_broken",
    "closed_if_left_mid_request",
    "driver_connection",
    "is_memory_sqlite",
    "is_packet_too_large",
    "make_engine",
    "normalize_url",
    "prepare_engine",
]

# Seconds a SQLite writer waits for the file's write lock before SQLITE_BUSY (then retried).
SQLITE_BUSY_TIMEOUT = 10.0

# The drivers taskgate is tested with, used when a URL names only the database.
_DEFAULT_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}

# A pooled connection back in use within this many seconds is taken as alive; an older one is
# pinged first. SQLAlchemy's ``pool_pre_ping`` pings on EVERY checkout: one more round trip
# per transition, the largest fixed cost of a short transaction. A connection that died within
# the window fails its transaction with a `BrokerError`, which the gate retries anyway.
PING_AFTER_IDLE = 1.0

# MySQL/MariaDB error ER_NET_PACKET_TOO_LARGE: a statement longer than max_allowed_packet.
PACKET_TOO_LARGE = 1153

# MySQL's default REPEATABLE READ would make a transaction's plain reads see its first
# snapshot, so a child's wake-up check could miss a parent committed meanwhile; READ
# COMMITTED also takes no gap locks, which keeps concurrent claims from deadlocking.
_MYSQL_ISOLATION = "READ COMMITTED"


def normalize_url(url: str | URL) -> URL:
    """``url`` as a SQLAlchemy URL, with psycopg/PyMySQL as the driver when none is named."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ConfigError(f"not a database URL: {url!r} ({exc})") from None
    driver = _DEFAULT_DRIVERS.get(parsed.drivername)
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    if parsed.get_backend_name() in ("mysql", "mariadb") and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed


def is_memory_sqlite(url: URL) -> bool:
    """True for a SQLite database that lives in one connection's memory."""
    database = url.database or ""
    return url.get_backend_name() == "sqlite" and (
        database in ("", ":memory:") or url.query.get("mode") == "memory"
    )


def make_engine(url: str | URL) -> Engine:
    """A new engine for ``url``, configured the way the broker needs its database."""
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    options: dict[str, Any] = {}
    if backend in ("mysql", "mariadb"):
        options.update(isolation_level=_MYSQL_ISOLATION, pool_recycle=3600)
    engine = create_engine(parsed, **options)
    event.listen(engine, "checkin", _note_checkin)
    event.listen(engine, "checkout", _ping_if_idle)
    event.listen(engine, "handle_error", _invalidate_if_broken)
    return engine


def _note_checkin(dbapi_connection: Any, record: Any) -> None:
    record.info["taskgate_idle_since"] = time.monotonic()


def _ping_if_idle(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Ping a connection idle past `PING_AFTER_IDLE`; a dead one is replaced by the pool."""
    since = record.info.get("taskgate_idle_since")
    if since is None or time.monotonic() - since < PING_AFTER_IDLE:
        return  # fresh from connect(), or in use a moment ago
    dialect = proxy._pool._dialect
    try:
        dialect.do_ping(dbapi_connection)
    except Exception as exc:
        if dialect.is_disconnect(exc, dbapi_connection, None):
            raise DisconnectionError(f"pooled connection is dead: {exc}") from exc
        raise


def closed_if_left_mid_request(dbapi_connection: Any) -> bool:
    """Close a psycopg connection that still owes the reply of an earlier request, or whose
    state libpq no longer knows, and say True: it could run nothing more.

    A session ended by the server while a request was being sent can leave the connection so
    ("another command is already in progress" on every later call), neither closed nor marked
    broken, which is all SQLAlchemy's disconnect test looks at. After an error a sound
    connection is idle or in a failed transaction, never here. Closed here, not left to the
    invalidation: SQLAlchemy drops a detached connection (a held one) without closing it.
    """
    info = getattr(dbapi_connection, "info", None)  # psycopg's ConnectionInfo; other drivers: none
    status = getattr(info, "transaction_status", None)
    if status is None or status.name not in ("ACTIVE", "UNKNOWN"):
        return False
    dbapi_connection.close()
    return True


def is_packet_too_large(exc: BaseException | None) -> bool:
    """True for a MySQL driver's error 1153: the statement was over ``max_allowed_packet``."""
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))  # MySQL drivers': (errno, message)
    return bool(args) and args[0] == PACKET_TOO_LARGE


def closed_if_broken(dbapi_connection: Any, exc: BaseException | None) -> bool:
    """Close a driver connection that ``exc`` left unusable, and say True.

    That is one left mid-request (`closed_if_left_mid_request`), or one whose statement was
    over MySQL's ``max_allowed_packet``: the server answers error 1153 and ends the session,
    but the driver does not know, and the next call on the connection, however small, would
    fail ("MySQL server has gone away"); not a disconnect to SQLAlchemy either.
    """
    if is_packet_too_large(exc):
        try:
            dbapi_connection.close()
        except Exception:  # the server ended the session already: closed either way
            pass
        return True
    return closed_if_left_mid_request(dbapi_connection)


def _invalidate_if_broken(context: ExceptionContext) -> None:
    """An error that left its connection unusable (`closed_if_broken`) counts as a
    disconnect: SQLAlchemy invalidates that connection, and only that one."""
    conn = context.connection
    if context.is_disconnect or conn is None or conn.invalidated:
        return
    if closed_if_broken(conn.connection.dbapi_connection, context.original_exception):
        context.is_disconnect = True
        context.invalidate_pool_on_disconnect = False


def driver_connection(conn: Connection) -> Any:
    """The driver's own connection under ``conn``, also when ``conn`` was detached from its
    pool (`taskgate.brokers.sql.held`), where the pool's proxy no longer names it."""
    return conn.dialect.get_driver_connection(conn.connection.dbapi_connection)  # type: ignore[arg-type]


def prepare_engine(engine: Engine) -> Engine:
    """The engine the broker uses on an app's ``engine``: same pool, taskgate's settings.

    The settings go on an option view of the engine, so the app's own connections keep theirs.
    """
    name = engine.dialect.name
    if name == "sqlite":
        view = engine.execution_options(taskgate_sqlite=True)
        event.listen(view, "begin", _begin_immediate)
        return view
    if name in ("mysql", "mariadb"):
        view = engine.execution_options(isolation_level=_MYSQL_ISOLATION)
    else:
        view = engine.execution_options()
    event.listen(view, "handle_error", _invalidate_if_broken)
    return view


def _sqlite_engine(url: URL) -> Engine:
    connect_args = {"timeout": SQLITE_BUSY_TIMEOUT, "check_same_thread": False}
    if is_memory_sqlite(url):
        # One shared connection, or every pool connection would see its own empty database.
        engine = create_engine(url, connect_args=connect_args, poolclass=StaticPool)
    else:
        engine = create_engine(url, connect_args=connect_args)
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _begin_immediate)
    return engine


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy, not pysqlite, decide when a transaction begins (see _begin_immediate).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # WAL: readers never block the writer nor the writer the readers, across processes.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _begin_immediate(conn: Any) -> None:
    """Start each transaction holding the write lock, unless it was marked read-only.

    A deferred transaction that reads and then writes can fail with SQLITE_BUSY when another
    writer got in between; taking the lock up front makes writers queue on busy_timeout.
    Under `nowait.no_wait` nothing queues: the lock is tried once (busy_timeout 0), and a
    SQLITE_BUSY goes up to the broker, which turns it into `nowait.WouldBlock`. (Holding the
    write lock, nothing else in a WAL transaction waits on another connection.)
    """
    mode = "BEGIN" if conn.get_execution_options().get("taskgate_read_only") else "BEGIN IMMEDIATE"
    # On the driver's connection: SQLAlchemy's statement machinery costs more than the BEGIN.
    raw = driver_connection(conn)
    try:
        if not nowait.active():
            raw.execute(mode)
            return
        (waits,) = raw.execute("PRAGMA busy_timeout").fetchone()
        raw.execute("PRAGMA busy_timeout=0")
        try:
            raw.execute(mode)
        finally:
            raw.execute(f"PRAGMA busy_timeout={int(waits)}")
    except sqlite3.Error as exc:
        # As SQLAlchemy would have raised it, so retries and error translation recognise it.
        raise DBAPIError.instance(mode, None, exc, sqlite3.Error) from exc
