"""What a broker implements to let `Gate.enqueue_in` write tasks in an application's transaction.

A broker declaring ``capabilities.in_app_transaction`` implements `InTransaction`: `submit_in`
stores tasks through a connection the application owns, inside the transaction it has open --
committed with the application's commit, gone with its rollback -- and `announce` tells this
process's waiters about the new work once that commit is done (`taskgate.enqueue` calls it
from an after-commit event).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from taskgate.brokers.params import Submit, Submitted

__all__ = ["InTransaction"]


@runtime_checkable
class InTransaction(Protocol):
    """A broker that writes tasks through an application's own SQLAlchemy connection."""

    def submit_in(self, connection: Connection, submit: Submit) -> Submitted:
        """Store ``submit.tasks`` through ``connection``, inside its open transaction, all or
        nothing, committing nothing; other processes are told (where the store can) only
        when that transaction commits. Raises `ConfigError` when ``connection`` is not on this
        broker's database (nothing written), and `submit`'s errors."""
        ...

    def announce(self, queues: Collection[str]) -> None:
        """Tell this process's waiters (`Broker.wait_for_work`) that ``queues`` may have work."""
        ...
