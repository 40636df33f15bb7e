"""Batch inserts on PostgreSQL with ``COPY … FROM STDIN`` (psycopg 3).

A multi-row INSERT makes the server parse and plan a statement per row (psycopg pipelines
them, but each is still executed on its own); COPY streams the rows into the table in one
command. Errors come out as SQLAlchemy's (`IntegrityError` for a taken key, and so on), like
those of every other statement, so callers and the retry loop need not know about COPY.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Connection, Table
from sqlalchemy.exc import DBAPIError

__all__ = ["copy_rows"]


def copy_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (all with the keys of the first) inside ``conn``'s transaction."""
    columns = tuple(rows[0])
    statement = _copy_statement(table.schema, table.name, columns)
    driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row([row[name] for name in columns])
    except psycopg.Error as exc:
        if driver.closed:
            conn.invalidate(exc)  # a lost server: the pool must not hand this connection out again
        raise DBAPIError.instance(statement.as_string(driver), None, exc, psycopg.Error) from exc


@functools.lru_cache(maxsize=32)
def _copy_statement(schema: str | None, table: str, columns: tuple[str, ...]) -> sql.Composed:
    target = sql.Identifier(schema, table) if schema else sql.Identifier(table)
    names = sql.SQL(", ").join(sql.Identifier(name) for name in columns)
    return sql.SQL("COPY {} ({}) FROM STDIN").format(target, names)
