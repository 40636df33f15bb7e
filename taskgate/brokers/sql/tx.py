"""The context every transition runs in: one connection inside one transaction, and its "now"."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

from sqlalchemy import Connection, Table
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.base import Executable

from taskgate.brokers.sql.dialects import Traits
from taskgate.brokers.sql.prepared import Prepared, PreparedCache, preparable
from taskgate.models import Models
from taskgate.task import Task

__all__ = ["OneStatement", "Tx", "table_of"]

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True, slots=True)
class OneStatement(Generic[T]):
    """A transition that is exactly one statement: what to send, and what its rows mean.

    The broker runs it with `Tx.one` in a broker thread or, on PostgreSQL, sends it from the
    event loop (`taskgate.brokers.sql.pg_split`); both read the rows with the same ``answer``.
    ``none_on_conflict``: a constraint violation (a taken id or key) answers None instead of
    raising -- the statement changed nothing, and the caller takes the slower path whose
    checks name what was wrong.
    """

    statement: Executable
    params: Mapping[str, Any]
    answer: Callable[[Sequence[Mapping[str, Any]]], T]
    none_on_conflict: bool = False

    def then(self, follow: Callable[[T], U]) -> OneStatement[U]:
        """The same statement, its answer passed through ``follow``."""
        answer = self.answer
        return OneStatement(
            self.statement, self.params, lambda rows: follow(answer(rows)), self.none_on_conflict
        )


@dataclass(slots=True)
class Tx:
    """One transaction of one transition.

    ``now`` is read once, on first use, from the broker's time source (the injected clock, or
    the database server), so every time a transition writes is the same instant.
    ``woken`` collects the queues that may have new work, announced when the transaction commits.
    ``settled``, a list while the broker reports what transitions settle on their own
    (`taskgate.brokers.base.Broker.report_settled`), collects those tasks' snapshots, handed
    on once the transaction committed; None: nothing to collect.
    """

    conn: Connection
    models: Models
    traits: Traits
    clock: Callable[[Connection], datetime]
    value_limit: int | None = None
    woken: set[str] = field(default_factory=set)
    # The broker's prepared statements (`taskgate.brokers.sql.prepared`); None: none prepared.
    prepared: PreparedCache | None = None
    settled: list[Task] | None = None
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

    def one(self, plan: OneStatement[T]) -> T:
        """Run ``plan``'s statement and answer its rows (None for a conflict it allows: its
        answer's type admits None then)."""
        try:
            rows = self.fetch(plan.statement, plan.params)
        except IntegrityError:
            if plan.none_on_conflict:
                return cast(T, None)
            raise
        return plan.answer(rows)

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
