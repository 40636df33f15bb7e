"""The hot transitions' statements run on the driver's cursor, compiled once by SQLAlchemy.

A claim or a batch of acks is a handful of small statements. Through ``Connection.execute``
each costs about 30 µs of SQLAlchemy's per-execution work (execution context, compiled-cache
look-up, result metadata) on top of a few µs in the database, and a SQLite claim-and-ack
cycle spent two thirds of its time there (see ``benchmarks/README.md``). A `Prepared`
statement is the same Core statement, compiled by SQLAlchemy once per dialect: the SQL text,
the order of its parameters and the type processors SQLAlchemy itself would apply on the way
in and out. Running it costs one cursor call plus those processors.

It runs inside the SQLAlchemy transaction of the `Tx` (same DBAPI connection), raises what
SQLAlchemy would raise (``DBAPIError`` subclasses, a dead connection invalidated), and steps
aside for ``Connection.exec_driver_sql`` -- the same SQL and parameters -- whenever someone
listens to the engine's cursor events or logs its statements, so tracing and statement
logging see every statement.

Statements whose SQL depends on the parameters (expanding ``IN``, literal-rendered values)
cannot be prepared; `Prepared.of` answers None for them and the caller executes normally.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from taskgate.brokers.sql.engine import closed_if_broken

__all__ = ["Prepared", "PreparedCache", "preparable", "traced"]

Processor = Callable[[Any], Any]
# A ``pyformat`` placeholder, or the doubled percent sign that stands for a literal one.
_PYFORMAT = re.compile(r"%\(([^)]+)\)s|%%")
# (name the driver sees, parameter key or None for a constant, the constant, its processor)
_Bind = tuple[str, str | None, Any, Processor | None]


class Prepared:
    """One statement compiled for one dialect, executed on the driver's cursor."""

    __slots__ = (
        "_binds",
        "_columns",
        "_dialect",
        "_numbered",
        "_numbered_binds",
        "_positional",
        "_results",
        "sql",
    )

    def __init__(self, compiled: SQLCompiler, columns: Sequence[Any], dialect: Dialect) -> None:
        self.sql = compiled.string
        self._dialect = dialect
        self._positional = compiled.positional
        by_name = {name: bind for bind, name in compiled.bind_names.items()}
        order = compiled.positiontup if compiled.positional else list(dict.fromkeys(by_name))
        escaped: dict[str, str] = dict(compiled.escaped_bind_names or {})
        binds: list[_Bind] = []
        for name in order or ():
            bind = by_name[name]
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if bind.required:
                binds.append((escaped.get(name, name), bind.key, None, process))
            else:  # a value written into the statement (a status, a constant): processed once
                value = bind.effective_value
                binds.append((escaped.get(name, name), None, process(value) if process else value, None))
        self._binds = tuple(binds)
        self._columns = tuple(column.key for column in columns)
        self._numbered: tuple[str, tuple[str, ...]] | None = None
        self._numbered_binds: tuple[int, ...] = ()  # the bind of each $n, by index in _binds
        self._results = tuple(
            (n, process)
            for n, column in enumerate(columns)
            if (process := column.type.dialect_impl(dialect).result_processor(dialect, None)) is not None
        )

    @classmethod
    def of(cls, statement: Executable, dialect: Dialect) -> Prepared | None:
        """``statement`` prepared for ``dialect``; None when its SQL varies with its parameters."""
        compiled = cast(ClauseElement, statement).compile(dialect=dialect)
        if not isinstance(compiled, SQLCompiler):
            return None
        if compiled.post_compile_params or compiled.literal_execute_params:
            return None
        columns = getattr(statement, "exported_columns", ())
        return cls(compiled, list(columns), dialect)

    def parameters(self, params: Mapping[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        """The driver's parameters for ``params`` (keyed by the statement's parameter names)."""
        values = self._values(params)
        if self._positional:
            return tuple(values)
        return {name: value for (name, _, _, _), value in zip(self._binds, values, strict=True)}

    def numbered_parameters(self, params: Mapping[str, Any]) -> list[Any]:
        """The driver's values for ``params`` in the order of `numbered`'s ``$1, $2, ...``."""
        self.numbered()
        values = self._values(params)
        return [values[n] for n in self._numbered_binds]

    def _values(self, params: Mapping[str, Any]) -> list[Any]:
        return [
            constant if key is None else (process(params[key]) if process else params[key])
            for _, key, constant, process in self._binds
        ]

    def rows(self, conn: Connection, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Execute and return every row as a dict of column key -> value (as SQLAlchemy reads it)."""
        parameters = self.parameters(params)
        if traced(conn):
            fetched: Sequence[Sequence[Any]] = conn.exec_driver_sql(self.sql, parameters).all()
        else:
            cursor = self._execute(conn, parameters)
            try:
                fetched = cursor.fetchall()
            finally:
                cursor.close()
        return [self.row(values) for values in fetched]

    def run(self, conn: Connection, params: Mapping[str, Any]) -> int:
        """Execute a statement returning no rows; its row count."""
        parameters = self.parameters(params)
        if traced(conn):
            return conn.exec_driver_sql(self.sql, parameters).rowcount
        cursor = self._execute(conn, parameters)
        try:
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def run_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per parameter set (the driver's ``executemany``)."""
        if not rows:
            return
        parameters = [self.parameters(row) for row in rows]
        if traced(conn):
            conn.exec_driver_sql(self.sql, parameters)
        else:
            self._execute(conn, parameters, many=True).close()

    def numbered(self) -> tuple[str, tuple[str, ...]]:
        """The SQL with libpq's own placeholders ``$1, $2, ...`` for its ``%(name)s`` ones, and
        the names in that order (a statement compiled for the ``pyformat`` paramstyle)."""
        if self._numbered is None:
            names: dict[str, int] = {}

            def number(match: re.Match[str]) -> str:
                name = match.group(1)
                if name is None:
                    return "%"  # a literal percent sign, doubled by the pyformat compiler
                return f"${names.setdefault(name, len(names) + 1)}"

            sql = _PYFORMAT.sub(number, self.sql)
            position = {name: n for n, (name, _, _, _) in enumerate(self._binds)}
            self._numbered_binds = tuple(position[name] for name in names)
            self._numbered = (sql, tuple(names))
        return self._numbered

    def row(self, values: Sequence[Any]) -> dict[str, Any]:
        """One row of driver values as a dict of column key -> value (as SQLAlchemy reads it)."""
        row = dict(zip(self._columns, values, strict=True))
        for n, process in self._results:
            key = self._columns[n]
            row[key] = process(row[key])
        return row

    def _execute(self, conn: Connection, params: Any, *, many: bool = False) -> Any:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            if many:
                cursor.executemany(self.sql, params)
            else:
                cursor.execute(self.sql, params)
        except self._dialect.loaded_dbapi.Error as exc:
            cursor.close()
            raise self._translated(conn, exc, params, cursor) from exc
        return cursor

    def _translated(self, conn: Connection, exc: Any, params: Any, cursor: Any) -> DBAPIError:
        """``exc`` as SQLAlchemy would raise it; a connection the error killed is invalidated."""
        # The pool's proxy, as SQLAlchemy passes it (a detached one has no driver_connection).
        lost = self._dialect.is_disconnect(exc, conn.connection, cursor) or closed_if_broken(
            conn.connection.dbapi_connection, exc
        )
        if lost:
            conn.invalidate(exc)
        error = DBAPIError.instance(
            self.sql,
            params,
            exc,
            self._dialect.loaded_dbapi.Error,
            connection_invalidated=lost,
            dialect=self._dialect,
        )
        return cast(DBAPIError, error)


def preparable(conn: Connection) -> bool:
    """False when statements on ``conn`` must be compiled per execution: a
    ``schema_translate_map`` renames the schemas the SQL compiled once would name."""
    return "schema_translate_map" not in conn.get_execution_options()


class PreparedCache:
    """The `Prepared` form of each statement a broker runs hot, per dialect, built on first use.

    Keyed by statement identity: the hot statements are themselves built once per schema. A
    statement built per call would never be found again; the cache starts over past
    `MAX_ENTRIES` rather than grow with such statements.
    """

    MAX_ENTRIES = 256

    def __init__(self) -> None:
        self._by_id: dict[tuple[int, int], tuple[Executable, Dialect, Prepared | None]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, statement: Executable, dialect: Dialect) -> Prepared | None:
        """``statement`` prepared for ``dialect`` (None: run it through SQLAlchemy)."""
        key = (id(statement), id(dialect))
        found = self._by_id.get(key)
        if found is None:
            if len(self._by_id) >= self.MAX_ENTRIES:
                self._by_id.clear()
            # The entry keeps the statement and dialect alive, so their ids stay theirs.
            found = (statement, dialect, Prepared.of(statement, dialect))
            self._by_id[key] = found
        return found[2]


def traced(conn: Connection) -> bool:
    """Whether SQLAlchemy must see the statement: cursor-event listeners, or statement logging
    (``echo``, or the ``sqlalchemy.engine`` logger at INFO: the connection's own flag for it)."""
    dispatch = conn.dispatch
    return conn._echo or bool(dispatch.before_cursor_execute or dispatch.after_cursor_execute)
