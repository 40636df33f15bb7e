"""Everything that differs between SQLite, PostgreSQL and MySQL/MariaDB, in one traits object.

The transitions are written once against `Traits`; each subclass says how its database
claims rows, takes row locks, inserts rows (one INSERT shape per table, `insert_rows`),
inserts-if-missing, tells "now", serialises schema creation, which errors mean "run the
transaction again", and how big a value may be.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    String,
    Table,
    any_,
    bindparam,
    cast,
    func,
    insert,
    select,
    text,
    true,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement, SQLCoreOperations
from sqlalchemy.sql.selectable import GenerativeSelect, TableValuedAlias
from sqlalchemy.types import TypeDecorator, TypeEngine

from taskgate.clock import utc
from taskgate.errors import ConfigError

if TYPE_CHECKING:
    from taskgate.brokers.sql.tx import Tx

__all__ = [
    "MySQLTraits",
    "PostgreSQLTraits",
    "SQLiteTraits",
    "Traits",
    "ValueLimit",
    "plain_insert",
    "row_insert",
    "row_params",
    "traits_for",
]

_S = TypeVar("_S", bound=GenerativeSelect)


@dataclass(frozen=True, slots=True)
class ValueLimit:
    """How big a payload or result a server takes: ``largest`` bytes, the most whose statement
    still fits in ``packet`` (the server's ``max_allowed_packet``) once the value is encoded."""

    packet: int
    largest: int


class Traits:
    """The SQLite/PostgreSQL/MySQL differences the broker needs; see each subclass for why."""

    name = "generic"
    push_wakeups = False
    # The database admits one writer at a time: a write transaction holds the write lock of the
    # whole database (SQLite: the file) until it commits, so two writes never run side by side.
    one_writer = False
    # The database runs inside this process (SQLite: a file, no server): a transition is local
    # work, with no network round trip to wait for.
    in_process = False
    # The driver sends a statement without waiting for its reply (PostgreSQL through psycopg).
    nonblocking_protocol = False
    # UPDATE … RETURNING: mark rows and read them back in one statement.
    update_returning = False
    # UPDATE/INSERT … RETURNING inside WITH: a transition of several writes in one statement.
    dml_ctes = False
    # The driver switches a pooled connection to autocommit and back without a round trip.
    cheap_autocommit = False

    def lock(self, stmt: _S, *, skip_locked: bool = False) -> _S:
        """``stmt`` taking write locks on the rows it reads (``SKIP LOCKED``: skip busy rows)."""
        return stmt.with_for_update(skip_locked=skip_locked)

    def lock_shared(self, stmt: _S) -> _S:
        """``stmt`` taking shared locks: the rows cannot change status until we commit."""
        return stmt.with_for_update(read=True)

    def lock_for_delete(self, stmt: _S) -> _S:
        """``stmt`` taking the strongest row locks, skipping busy rows: rows about to be
        deleted, whose foreign-key checks by concurrent inserts must wait for the delete."""
        return stmt.with_for_update(skip_locked=True)

    def insert_if_missing(self, table: Table, values: Mapping[str, Any]) -> Insert:
        """An INSERT of ``values`` that does nothing when the primary key exists already."""
        raise NotImplementedError

    def is_retryable(self, exc: BaseException) -> bool:
        """True when ``exc`` means the transaction was rolled back by a deadlock or write conflict."""
        return False

    def server_now(self, conn: Connection) -> datetime:
        """The database server's clock at this moment (not frozen at the transaction's start)."""
        raise NotImplementedError

    @property
    def host_clock(self) -> bool:
        """True when "the server's clock" is this host's: a database in this process has none."""
        return self.in_process

    @contextmanager
    def schema_transaction(self, engine: Engine, name: str) -> Iterator[Connection]:
        """A transaction holding a lock named ``name`` until it has committed, so only one
        process creates the schema at a time and the next one sees what it created. (SQLite:
        ``BEGIN IMMEDIATE`` takes the file's write lock, held to the commit.)"""
        with engine.begin() as conn:
            yield conn

    def value_limit(self, conn: Connection) -> ValueLimit | None:
        """How big a payload/result the server accepts, or None for no practical limit."""
        return None

    def notify(self, conn: Connection, channel: str, queues: Sequence[str]) -> None:
        """Tell other processes, on commit, that ``queues`` may have work (push wake-ups only)."""

    def random_token(self) -> ColumnElement[str]:
        """SQL for a fresh lease token drawn by the server (32 hex digits); ``dml_ctes`` only."""
        raise NotImplementedError

    def commit_without_flush_wait(self) -> ColumnElement[Any] | None:
        """A column that lets the commit of the one autocommit statement selecting it return
        before its WAL reaches disk; None where the database has no per-transaction switch.

        Only for transitions a server crash may undo without losing work (see `leases.claim`).
        """
        return None

    def insert_rows(self, tx: Tx, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """INSERT ``rows`` (each with the same columns of ``table``) in one driver call, by the
        table's one INSERT shape: ``INSERT … VALUES``, one row per parameter set (`plain_insert`;
        PyMySQL sends a batch as one multi-row INSERT)."""
        tx.write_many(plain_insert(table), rows)

    def listed(self, column: SQLCoreOperations[str], name: str) -> ColumnElement[bool]:
        """``column`` is one of the strings in the list passed as parameter ``name``.

        An expanding ``IN`` here: SQLAlchemy renders one placeholder per item at each run.
        """
        return column.in_(bindparam(name, expanding=True))

    def unnest(self, name: str, **columns: tuple[str, TypeEngine[Any]]) -> TableValuedAlias:
        """A FROM item ``name`` whose rows zip list parameters: ``column=(parameter, type)``.

        ``dml_ctes`` only: a batch of any size in one cached statement.
        """
        raise NotImplementedError


class PostgreSQLTraits(Traits):
    """PostgreSQL: ``UPDATE … WHERE id IN (SELECT … FOR NO KEY UPDATE SKIP LOCKED) RETURNING``,
    with the lease INSERT in the same statement (data-modifying CTEs)."""

    name = "postgresql"
    push_wakeups = True
    update_returning = True
    dml_ctes = True
    cheap_autocommit = True  # psycopg: a client-side switch (PyMySQL sends SET autocommit)
    _RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock
    # Below this many rows their INSERTs (pipelined by psycopg) cost no more than setting up a COPY.
    _COPY_FROM = 16

    def __init__(self, driver: str = "") -> None:
        # The driver sends a statement without waiting and reads its reply once the socket is
        # readable (libpq's asynchronous API, through psycopg): a one-statement call can be
        # sent from the event loop (`taskgate.brokers.sql.pg_split`).
        self.nonblocking_protocol = driver == "psycopg"

    def lock(self, stmt: _S, *, skip_locked: bool = False) -> _S:
        # NO KEY UPDATE: we never change a primary key, and the weaker lock lets foreign-key
        # checks of concurrent inserts (new children, leases) proceed instead of queueing.
        return stmt.with_for_update(skip_locked=skip_locked, key_share=True)

    def insert_if_missing(self, table: Table, values: Mapping[str, Any]) -> Insert:
        """``INSERT … ON CONFLICT DO NOTHING``."""
        return postgresql.insert(table).values(dict(values)).on_conflict_do_nothing()

    def is_retryable(self, exc: BaseException) -> bool:
        """SQLSTATE 40001 (serialization failure) and 40P01 (deadlock detected)."""
        orig = exc.orig if isinstance(exc, DBAPIError) else None
        return getattr(orig, "sqlstate", None) in self._RETRYABLE_SQLSTATES

    def server_now(self, conn: Connection) -> datetime:
        """``clock_timestamp()``: the time now, even late in a transaction that waited on locks."""
        return utc(conn.execute(select(func.clock_timestamp())).scalar_one())

    @contextmanager
    def schema_transaction(self, engine: Engine, name: str) -> Iterator[Connection]:
        """A transaction-scoped advisory lock; PostgreSQL DDL is transactional, so it covers all."""
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": name})
            yield conn

    def notify(self, conn: Connection, channel: str, queues: Sequence[str]) -> None:
        """``pg_notify`` per queue; PostgreSQL delivers them when (and only if) we commit."""
        for queue in sorted(set(queues)):
            conn.execute(select(func.pg_notify(channel, queue)))

    def random_token(self) -> ColumnElement[str]:
        """``gen_random_uuid()`` (PostgreSQL >= 13, a strong random source) as 32 hex digits."""
        return func.replace(cast(func.gen_random_uuid(), String), "-", "")

    def listed(self, column: SQLCoreOperations[str], name: str) -> ColumnElement[bool]:
        """``column = ANY(:name)``, the list sent as one array: one statement text for any length."""
        return column == any_(bindparam(name, type_=postgresql.ARRAY(String)))

    def commit_without_flush_wait(self) -> ColumnElement[Any] | None:
        """``set_config('synchronous_commit', 'off', true)``: for this transaction only (is_local),
        read when it commits; the next commit that waits flushes this one's WAL too."""
        return select(func.set_config("synchronous_commit", "off", true())).scalar_subquery()

    def insert_rows(self, tx: Tx, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """The table's one INSERT shape (`row_insert`), the one a single submit's statement is
        built around, once per row (psycopg pipelines them). A batch of `_COPY_FROM` rows or
        more goes in by ``COPY … FROM STDIN`` instead: the server ingests the rows without
        parsing and running an INSERT each.

        psycopg's errors come out as SQLAlchemy's (`IntegrityError` for a taken key, and so on),
        like those of every other statement, so callers and retries need not know about COPY.
        """
        if len(rows) >= self._COPY_FROM and tx.conn.dialect.driver == "psycopg":
            from taskgate.brokers.sql.pg_copy import copy_rows  # psycopg is an optional dependency

            copy_rows(tx.conn, table, rows)
            return
        tx.write_many(_row_insert(table, tuple(rows[0])), [row_params(row) for row in rows])

    def unnest(self, name: str, **columns: tuple[str, TypeEngine[Any]]) -> TableValuedAlias:
        """``unnest(array, array, …) AS name(column, …)`` over typed array parameters."""
        arrays = [bindparam(param, type_=postgresql.ARRAY(type_)) for param, type_ in columns.values()]
        return func.unnest(*arrays).table_valued(*columns).render_derived(name=name)


class MySQLTraits(Traits):
    """MySQL 8 / MariaDB >= 10.6: ``SELECT … FOR UPDATE SKIP LOCKED`` then ``UPDATE`` by ids."""

    name = "mysql"
    # 1213 deadlock, 1205 lock wait timeout (the statement or whole transaction rolled back).
    _RETRYABLE_ERRNOS = frozenset({1213, 1205})
    # Room for the statement around the value inside one max_allowed_packet.
    _PACKET_SLACK = 64 * 1024
    # A bytes value travels inside the statement's text: PyMySQL writes it as hex
    # (``_binary X'…'``, two characters a byte, eleven around them); a driver that escapes
    # instead writes at most two characters a byte too.
    _ENCODED_PER_BYTE = 2
    _ENCODED_AROUND = len("_binary X''")
    # Drivers known (and tested) to quote a list parameter themselves as a parenthesised list.
    _LIST_QUOTING_DRIVERS = frozenset({"pymysql"})

    def __init__(self, driver: str = "") -> None:
        self._driver_quotes_lists = driver in self._LIST_QUOTING_DRIVERS

    def listed(self, column: SQLCoreOperations[str], name: str) -> ColumnElement[bool]:
        """``column IN %(name)s``, the list quoted by PyMySQL as ``('a', 'b', …)``: one
        statement text for any length, so it runs prepared where an expanding ``IN`` is
        rendered again at every run. An empty list matches nothing. Other drivers get the
        expanding ``IN``."""
        if not self._driver_quotes_lists:
            return super().listed(column, name)
        return column.op("IN")(bindparam(name, type_=DriverQuotedList()))

    def insert_if_missing(self, table: Table, values: Mapping[str, Any]) -> Insert:
        """``INSERT IGNORE`` (the values are ours and valid, so only the duplicate is ignored)."""
        return table.insert().values(dict(values)).prefix_with("IGNORE")

    def is_retryable(self, exc: BaseException) -> bool:
        """Error 1213 (deadlock) and 1205 (lock wait timeout)."""
        orig = exc.orig if isinstance(exc, DBAPIError) else None
        args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
        return bool(args) and args[0] in self._RETRYABLE_ERRNOS

    def server_now(self, conn: Connection) -> datetime:
        """``UTC_TIMESTAMP(6)``: UTC with microseconds whatever the session time zone."""
        value = conn.execute(select(func.utc_timestamp(text("6")))).scalar_one()
        return utc(value)

    @contextmanager
    def schema_transaction(self, engine: Engine, name: str) -> Iterator[Connection]:
        """``GET_LOCK`` (the session's): MySQL DDL commits implicitly, so a transaction cannot
        serialise it. Released only once the transaction has committed: released before, the
        next process would miss the version row this one wrote and write it again.

        Its name is the server's (PostgreSQL's advisory locks are the database's), so it is
        made of the database's name and ``name``, hashed to fit the 64 characters a lock name
        may have: schemas of other databases on the server are made meanwhile, not after.
        """
        lock = func.sha1(func.concat(func.database(), ".", name))
        with engine.connect() as conn:
            got = conn.execute(select(func.get_lock(lock, 60))).scalar()
            conn.commit()  # the lock outlives the transaction its statement began
            if got != 1:
                raise TimeoutError(f"could not take MySQL lock {name!r} within 60 s to create the schema")
            try:
                with conn.begin():
                    yield conn
            finally:
                conn.execute(select(func.release_lock(lock)))

    def value_limit(self, conn: Connection) -> ValueLimit:
        """``max_allowed_packet``, and the largest value whose encoding (`_ENCODED_PER_BYTE`)
        fits in it with room for the rest of the statement. Past it the server refuses the
        statement and closes the session (error 1153), rather than storing a thing."""
        packet = int(conn.execute(text("SELECT @@max_allowed_packet")).scalar_one())
        room = packet - self._PACKET_SLACK - self._ENCODED_AROUND
        return ValueLimit(packet=packet, largest=max(room, 0) // self._ENCODED_PER_BYTE)


class SQLiteTraits(Traits):
    """SQLite: every write transaction starts with ``BEGIN IMMEDIATE``, so writers take turns.

    Row locks do not exist and are not needed: the write lock held from the first statement
    means nobody else can claim, cancel or finish concurrently.
    """

    name = "sqlite"
    one_writer = True
    in_process = True
    _BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
    update_returning = sqlite3.sqlite_version_info >= (3, 35)  # RETURNING arrived in 3.35

    def lock(self, stmt: _S, *, skip_locked: bool = False) -> _S:
        """No row locks: the immediate write transaction already excludes other writers."""
        return stmt

    def lock_shared(self, stmt: _S) -> _S:
        """No row locks: the immediate write transaction already excludes other writers."""
        return stmt

    def lock_for_delete(self, stmt: _S) -> _S:
        """No row locks: the immediate write transaction already excludes other writers."""
        return stmt

    def insert_if_missing(self, table: Table, values: Mapping[str, Any]) -> Insert:
        """``INSERT … ON CONFLICT DO NOTHING``."""
        return sqlite_dialect.insert(table).values(dict(values)).on_conflict_do_nothing()

    def is_retryable(self, exc: BaseException) -> bool:
        """SQLITE_BUSY/SQLITE_LOCKED: another process held the write lock past busy_timeout."""
        orig = exc.orig if isinstance(exc, DBAPIError) else None
        code = getattr(orig, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in self._BUSY_CODES

    def listed(self, column: SQLCoreOperations[str], name: str) -> ColumnElement[bool]:
        """``column IN (SELECT value FROM json_each(:name))``, the list sent as one JSON text.

        The statement text does not depend on the list's length, so neither SQLAlchemy (which
        re-renders an expanding parameter at every run) nor sqlite3's statement cache has
        work to redo.
        """
        items = func.json_each(bindparam(name, type_=JSONList())).table_valued("value")
        return column.in_(select(items.c.value))

    def server_now(self, conn: Connection) -> datetime:
        """The host's clock: a database file has none, and every user runs on this host."""
        return datetime.now(UTC)


@functools.lru_cache(maxsize=64)
def plain_insert(table: Table) -> Insert:
    """``INSERT INTO table``, built once per table: a Core statement built per call costs more
    (its cache key, then the compiled-cache look-up) than the single-row INSERT it runs."""
    return insert(table)


def row_insert(
    table: Table, columns: Sequence[str], *, prefix: str = "p_", where: ColumnElement[bool] | None = None
) -> Insert:
    """``INSERT INTO table (columns) SELECT :p_column, …``, one row of parameters named
    ``prefix + column`` (`row_params`), inserted only if ``where`` holds when given:
    PostgreSQL's one INSERT shape for a task or business-key row, sent alone (a batch as many
    parameter sets) or as a CTE of a statement that does more (a single submit)."""
    values = select(*(bindparam(f"{prefix}{name}", type_=table.c[name].type) for name in columns))
    if where is not None:
        values = values.where(where)
    return insert(table).from_select(list(columns), values)


def row_params(row: Mapping[str, Any], *, prefix: str = "p_") -> dict[str, Any]:
    """`row_insert`'s parameters for ``row`` (column -> value)."""
    return {f"{prefix}{name}": value for name, value in row.items()}


@functools.lru_cache(maxsize=64)
def _row_insert(table: Table, columns: tuple[str, ...]) -> Insert:
    """`row_insert` of ``columns``, built once (so it runs prepared)."""
    return row_insert(table, columns)


class JSONList(TypeDecorator[list[str]]):
    """A list of strings bound as one JSON array text (`SQLiteTraits.listed`)."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: list[str] | None, dialect: Any) -> str | None:
        return None if value is None else json.dumps(list(value))


class DriverQuotedList(TypeDecorator[list[str]]):
    """A list of strings the driver quotes itself (`MySQLTraits.listed`): as a tuple, and an
    empty list as ``(NULL)``, which matches nothing where ``()`` would not parse."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: Sequence[str] | None, dialect: Any) -> tuple[str | None, ...] | None:
        if value is None:
            return None
        return tuple(value) or (None,)


def traits_for(dialect_name: str, driver: str = "") -> Traits:
    """The traits of a SQLAlchemy dialect (its name, and its driver's where it matters); an
    unsupported database fails loudly."""
    if dialect_name == "postgresql":
        return PostgreSQLTraits(driver)
    if dialect_name in ("mysql", "mariadb"):
        return MySQLTraits(driver)
    if dialect_name == "sqlite":
        return SQLiteTraits()
    raise ConfigError(f"SQLBroker supports sqlite, postgresql and mysql/mariadb, not {dialect_name!r}")
