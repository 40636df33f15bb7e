"""Wide rows read with their small columns packed into one JSON array (MySQL/MariaDB).

PyMySQL parses every column of every row in Python: a claim's ten task rows of 21 columns cost
the worker more CPU than the claim's round trips (the benchmarks' twenty-second round, in the
git history of ``benchmarks/README.md``). Here a SELECT of many columns is sent as ``SELECT
JSON_ARRAY(<its columns of bounded size>), <the others> …``: the server formats the small
columns as JSON and ``json.loads`` (C) parses them. Each value is brought back to what PyMySQL
itself would have read (a naive ``datetime`` from its text), then the column type's own result
processor runs, so a row reads exactly as it would otherwise.

Only columns of bounded size are packed: strings with a length (at most 255 characters here),
numbers, booleans, datetimes. A row's array therefore stays far below ``max_allowed_packet``,
beyond which the server would answer NULL for it. Blobs and long texts (payload, result, last
error, parents) stay plain columns, which PyMySQL passes through without converting them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, TypeDecorator, func
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler

from taskgate.brokers.sql.prepared import Prepared

__all__ = ["MIN_PACKED", "JsonRows"]

# Fewer small columns than this are read as they are: packing a few saves little.
MIN_PACKED = 8

# How a packed column's JSON value becomes what the driver reads (None: as JSON has it).
Decode = Callable[[Any], Any] | None


class JsonRows(Prepared):
    """A wide SELECT whose small columns travel as one JSON array, its rows read back as the
    plain statement's would be."""

    __slots__ = ("_decoders", "_order")

    def __init__(self, statement: Select[Any], dialect: Dialect, ways: Sequence[tuple[bool, Decode]]) -> None:
        columns = list(statement.selected_columns)
        packed = [n for n, (pack, _) in enumerate(ways) if pack]
        plain = [n for n, (pack, _) in enumerate(ways) if not pack]
        transported = statement.with_only_columns(
            func.json_array(*(columns[n] for n in packed)),
            *(columns[n] for n in plain),
            maintain_column_froms=True,
        )
        compiled = transported.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)  # as the plain statement's (`Prepared.of`)
        super().__init__(compiled, columns, dialect)
        self._decoders = tuple(ways[n][1] for n in packed)
        # Where each column's value is among [*packed values, *plain values].
        slot = {n: k for k, n in enumerate([*packed, *plain])}
        self._order = tuple(slot[n] for n in range(len(columns)))

    @classmethod
    def of(cls, statement: Executable, dialect: Dialect) -> Prepared | None:
        """``statement`` with its small columns packed when it is a SELECT of at least
        `MIN_PACKED` of them; else as `Prepared.of` would prepare it."""
        plain = Prepared.of(statement, dialect)
        if plain is None or not isinstance(statement, Select):
            return plain
        ways = [_way(column, dialect) for column in statement.selected_columns]
        if sum(pack for pack, _ in ways) < MIN_PACKED:
            return plain
        return cls(statement, dialect, ways)

    def row(self, values: Sequence[Any]) -> dict[str, Any]:
        """One row of driver values (its array first) as the plain statement reads it."""
        packed = [
            value if decode is None or value is None else decode(value)
            for decode, value in zip(self._decoders, json.loads(values[0]), strict=True)
        ]
        both = [*packed, *values[1:]]
        return super().row([both[k] for k in self._order])


def _way(column: Any, dialect: Dialect) -> tuple[bool, Decode]:
    """Whether ``column`` is packed, and how its JSON value becomes what the driver reads."""
    impl = column.type.dialect_impl(dialect)
    if isinstance(impl, TypeDecorator):
        impl = impl.impl_instance
    try:
        kind = impl.python_type
    except NotImplementedError:
        return False, None
    if kind is datetime:
        return True, datetime.fromisoformat  # "YYYY-MM-DD hh:mm:ss[.ffffff]", naive as PyMySQL's
    bounded_text = kind is str and getattr(impl, "length", None) is not None
    return kind in (bool, int) or bounded_text, None  # numbers and bounded text, as JSON has them
