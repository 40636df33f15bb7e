"""The context every transition runs in: one connection inside one transaction, and its "now"."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Table
from sqlalchemy.sql.base import Executable

from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.prepared import Prepared, PreparedCache, preparable
from taskgate.models import Models

__all__ = ["Tx", "table_of"]


@dataclass(slots=True)
class Tx:
    """One transaction of one transition.

    ``now`` is read once, on first use, from the broker's time source (the injected clock, or
    the database server), so every time a transition writes is the same instant.
    ``woken`` collects the queues that may have new work, announced when the transaction commits.
    """

    conn: Connection
    models: Models
    traits: Traits
    clock: Callable[[Connection], datetime]
    value_limit: int | None = None
    woken: set[str] = field(default_factory=set)
    # The broker's prepared statements (`taskgate.brokers.sql.prepared`); None: none prepared.
    prepared: PreparedCache | None = None
    _now: datetime | None = None

    @property
    def now(self) -> datetime:
        """The transition's time, aware UTC."""
        if self._now is None:
            self._now = self.clock(self.conn)
        return self._now

    # The hot statements (built once per schema) go through these three: prepared when the
    # broker keeps prepared statements and the statement can be, through SQLAlchemy otherwise.

    def _prepared(self, statement: Executable) -> Prepared | None:
        if self.prepared is None or not preparable(self.conn):
            return None
        return self.prepared.get(statement, self.conn.dialect)

    def fetch(self, statement: Executable, params: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        """The rows ``statement`` returns, as mappings of column key -> value."""
        prepared = self._prepared(statement)
        if prepared is None:
            return cast(Sequence[Mapping[str, Any]], self.conn.execute(statement, params).mappings().all())
        return prepared.rows(self.conn, params)

    def write(self, statement: Executable, params: Mapping[str, Any]) -> int:
        """Execute a statement returning no rows; the number of rows it matched."""
        prepared = self._prepared(statement)
        if prepared is None:
            return int(self.conn.execute(statement, params).rowcount)
        return prepared.run(self.conn, params)

    def write_many(self, statement: Executable, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute ``statement`` once per parameter set in ``rows`` (one driver call)."""
        if not rows:
            return
        prepared = self._prepared(statement)
        if prepared is None:
            self.conn.execute(statement, list(rows))
        else:
            prepared.run_many(self.conn, rows)


def table_of(model: Any) -> Table:
    """The Core table behind a mapped class (for RETURNING lists and the traits' statements)."""
    table: Table = model.__table__
    return table
