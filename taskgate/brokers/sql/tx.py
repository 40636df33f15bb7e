"""The context every transition runs in: one connection inside one transaction, and its "now"."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table

from taskgate.brokers.sql.dialects import Traits
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
    _now: datetime | None = None

    @property
    def now(self) -> datetime:
        """The transition's time, aware UTC."""
        if self._now is None:
            self._now = self.clock(self.conn)
        return self._now


def table_of(model: Any) -> Table:
    """The Core table behind a mapped class (for RETURNING lists and the traits' statements)."""
    table: Table = model.__table__
    return table
