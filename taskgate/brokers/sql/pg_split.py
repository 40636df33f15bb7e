"""PostgreSQL's one-statement calls split in two (`taskgate.brokers.split`).

On PostgreSQL a submit, a claim and a read of one task are each ONE statement in autocommit
(`taskgate.brokers.sql.tx.OneStatement`) on the broker's held connection. In a broker thread
the call costs two thread hops besides the statement (0.76 ms of a 3.0 ms submit→start after
an idle pause). Split, the statement leaves from the event loop through libpq's asynchronous
calls (psycopg's `pq` layer), and its reply is read there once the socket is readable.

The statement is the broker's own `Prepared` form with libpq's ``$n`` placeholders, and
psycopg's `Transformer` turns the parameters into what the server reads and the rows back into
Python values, as psycopg's cursor does: a split call reads exactly what the same call in a
thread reads. Each statement is prepared on the server once per session, under a name of our
own: the first call of it on a connection sends PREPARE, then from its reply the EXECUTE. A
connection psycopg was told to prepare nothing on (``prepare_threshold=None``, as behind
PgBouncer in transaction mode) splits nothing, nor does an engine set to a paramstyle other
than ``pyformat``; a request larger than
`taskgate.brokers.split.MAX_SPLIT_REQUEST` (a big payload) is sent from a thread: the event loop
never waits for the server to read what it sends.

Every error the server answers sends the call back to the thread path (`WouldBlock`): a
statement in autocommit that failed changed nothing, and in a thread SQLAlchemy's errors, the
broker's retries and its messages apply. A connection that breaks mid-call is invalidated (the
held connection is replaced on its next use) and the call fails with `BrokerError`, as in a thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import pq
from psycopg.abc import Buffer
from psycopg.adapt import PyFormat, Transformer
from sqlalchemy import Connection

from taskgate.brokers import nowait
from taskgate.brokers.split import MAX_SPLIT_REQUEST, SplitCall
from taskgate.brokers.sql.engine import driver_connection
from taskgate.brokers.sql.held import HeldConnection
from taskgate.brokers.sql.prepared import Prepared
from taskgate.errors import BrokerError

__all__ = ["StatementCall", "send"]

T = TypeVar("T")

# The server lost a statement prepared on the session (invalid_sql_statement_name): DISCARD ALL,
# DEALLOCATE, or a pooler between us and the server handing us another session.
_STATEMENT_GONE = b"26000"


class _Session:
    """What split calls keep for one server session: psycopg's adaptation context, and the
    name each statement is prepared under."""

    __slots__ = ("names", "prepares", "transformer")

    def __init__(self, driver: psycopg.Connection[Any]) -> None:
        self.transformer = Transformer(driver)
        self.names: dict[tuple[str, tuple[int, ...]], bytes] = {}
        self.prepares = 0  # names are never reused: a forgotten one may still exist on the server

    def next_name(self) -> bytes:
        self.prepares += 1
        return f"taskgate_{self.prepares}".encode()


class _Phase(Enum):
    PREPARING = 1
    EXECUTING = 2
    DONE = 3


def send(
    held: HeldConnection,
    conn: Connection,
    prepared: Prepared,
    params: Mapping[str, Any],
    answer: Callable[[list[dict[str, Any]]], T],
) -> SplitCall[T] | None:
    """Send ``prepared`` with ``params`` on ``conn``, taken from ``held`` (`HeldConnection.take`);
    its rows go to ``answer``. The call gives ``conn`` back once its reply is read. None when
    nothing was sent (the connection was given back): run the method in a thread."""
    try:
        driver = driver_connection(conn)
        if driver.prepare_threshold is None or conn.dialect.paramstyle != "pyformat":
            # Told to prepare nothing (a pooler in transaction mode between us and the server
            # would run our EXECUTE on a session that never saw our PREPARE); or placeholders
            # other than the ``%(name)s`` ones `Prepared.numbered` numbers for libpq.
            held.give_back(conn)
            return None
        session = held.session.get("pg_split")
        if not isinstance(session, _Session):
            session = held.session["pg_split"] = _Session(driver)
        sql, _ = prepared.numbered()
        values = prepared.numbered_parameters(params)
        transformer = session.transformer
        dumped = transformer.dump_sequence(values, [PyFormat.AUTO] * len(values))
        key = (sql, tuple(transformer.types or ()))
        name = session.names.get(key)
        too_big = sum(len(value) for value in dumped if value is not None) > MAX_SPLIT_REQUEST
    except psycopg.Error:  # a value psycopg cannot adapt: the thread path raises what it raises
        held.give_back(conn)
        return None
    except BaseException:
        held.give_back(conn)
        raise
    if too_big:  # a big payload: sent from a thread, the event loop never waits for the server
        held.give_back(conn)
        return None
    formats = transformer.formats or ()
    call = StatementCall(held, conn, driver.pgconn, session, key, answer, prepared, dumped, formats)
    try:
        if name is not None:
            call.send_execute(name)
        else:
            call.send_prepare(sql)
    except psycopg.Error as exc:  # the connection failed: nothing was sent whole
        _drop(conn, exc)
        held.give_back(conn)
        return None
    return SplitCall(call.fileno(), call.receive, call.result)


def _drop(conn: Connection, exc: Exception) -> None:
    """Close a held connection that failed, and mark it so: SQLAlchemy's invalidation drops a
    detached connection without closing the driver's (left open, still owing a reply, if the
    session ended while a request was being sent)."""
    driver_connection(conn).close()
    conn.invalidate(exc)


class StatementCall(Generic[T]):
    """One statement sent from the event loop: what its `taskgate.brokers.split.SplitCall`
    reads the reply with (no timeout: a statement in a thread waits as long as the server
    takes, and so does a split one)."""

    def __init__(
        self,
        held: HeldConnection,
        conn: Connection,
        pgconn: pq.abc.PGconn,
        session: _Session,
        key: tuple[str, tuple[int, ...]],
        answer: Callable[[list[dict[str, Any]]], T],
        prepared: Prepared,
        dumped: Sequence[Buffer | None],
        formats: Sequence[pq.Format],
    ) -> None:
        self._held = held
        self._conn: Connection | None = conn
        self._pgconn = pgconn
        self._session = session
        self._key = key
        self._answer = answer
        self._prepared = prepared
        self._phase = _Phase.EXECUTING
        self._reply: pq.abc.PGresult | None = None
        self._rows: list[dict[str, Any]] | None = None
        self._failure: BrokerError | None = None
        self._name = b""
        self._dumped = dumped
        self._formats = list(formats)

    def send_prepare(self, sql: str) -> None:
        """First use on this session: PREPARE; the EXECUTE follows its reply (`receive`)."""
        self._name = self._session.next_name()
        with _blocking(self._pgconn):
            self._pgconn.send_prepare(self._name, sql.encode(), self._key[1])
        self._phase = _Phase.PREPARING

    def send_execute(self, name: bytes) -> None:
        """EXECUTE of a statement prepared on this session."""
        with _blocking(self._pgconn):
            self._pgconn.send_query_prepared(name, self._dumped, self._formats)
        self._phase = _Phase.EXECUTING

    def fileno(self) -> int:
        """The connection's socket."""
        return self._pgconn.socket

    def receive(self) -> bool:
        """Read what arrived; True once the statement's reply is whole."""
        if self._phase is _Phase.DONE:
            return True
        pgconn = self._pgconn
        try:
            pgconn.consume_input()
            while not pgconn.is_busy():
                reply = pgconn.get_result()
                if reply is not None:
                    if self._reply is None or reply.status == pq.ExecStatus.FATAL_ERROR:
                        self._reply = reply
                    continue
                if self._phase is _Phase.PREPARING and self._prepared_now():
                    self.send_execute(self._name)
                    return False
                self._complete()
                return True
        except psycopg.Error as exc:
            self._lost(exc)
            raise BrokerError(f"PostgreSQL connection lost during a split call: {exc}") from exc
        return False

    def result(self) -> T:
        """The method's answer; `WouldBlock` when the server answered an error (nothing ran)."""
        if self._failure is not None:
            raise self._failure
        if self._rows is None:
            raise nowait.WouldBlock("the server answered an error: the thread path names it")
        return self._answer(self._rows)

    def _prepared_now(self) -> bool:
        """The PREPARE's reply is in: on success, remember the name and say so."""
        reply, self._reply = self._reply, None
        ok = reply is not None and reply.status == pq.ExecStatus.COMMAND_OK
        if ok:  # else the thread path runs the call, and the next split prepares again
            self._session.names[self._key] = self._name
        return ok

    def _complete(self) -> None:
        """The reply is whole: read its rows, give the connection back."""
        reply, self._reply = self._reply, None
        self._phase = _Phase.DONE
        try:
            if reply is not None and reply.status == pq.ExecStatus.TUPLES_OK:
                self._rows = self._loaded(reply)
            elif reply is not None and reply.error_field(pq.DiagnosticField.SQLSTATE) == _STATEMENT_GONE:
                self._session.names.clear()  # the thread path runs it; the next split prepares again
        except Exception as exc:
            # The statement ran: running it again in a thread could claim twice. The call
            # fails, as a thread call whose rows cannot be read fails after its commit.
            self._failure = BrokerError(f"the reply of a PostgreSQL split call could not be read: {exc}")
            self._failure.__cause__ = exc
        finally:
            self._give_back()  # the session is sound: it answered whole

    def _loaded(self, reply: pq.abc.PGresult) -> list[dict[str, Any]]:
        transformer = self._session.transformer
        transformer.set_pgresult(reply)
        try:
            loaded = transformer.load_rows(0, reply.ntuples, tuple)
        finally:
            transformer.set_pgresult(None)
        return [self._prepared.row(values) for values in loaded]

    def _lost(self, exc: Exception) -> None:
        self._phase = _Phase.DONE
        if self._conn is not None:
            _drop(self._conn, exc)
        self._give_back()

    def _give_back(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._held.give_back(conn)


class _blocking:
    """libpq in blocking mode while a request is sent: it leaves whole, or the send fails.

    psycopg keeps its connections non-blocking, where a send may leave part of the request
    for a later flush; ours are a few hundred bytes, which a socket's send buffer takes at once.
    """

    __slots__ = ("_pgconn",)

    def __init__(self, pgconn: pq.abc.PGconn) -> None:
        self._pgconn = pgconn

    def __enter__(self) -> None:
        self._pgconn.nonblocking = 0

    def __exit__(self, *exc: object) -> None:
        self._pgconn.nonblocking = 1
