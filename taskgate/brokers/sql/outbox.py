"""`SQLBroker.submit_in`'s pieces: is the application's connection on our database, and the write.

The write is `create.store_new` -- the one INSERT shape every submit uses -- run on the
application's connection, in the transaction it has open, plus the dialect's transactional
wake-up (``pg_notify`` on PostgreSQL, delivered only if that transaction commits).
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import URL, Engine

from taskgate.brokers.params import Submit
from taskgate.brokers.sql import create
from taskgate.brokers.sql.tx import Tx
from taskgate.errors import ConfigError

__all__ = ["check_same_database", "store_in"]

_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


def _identity(url: URL) -> tuple[Any, ...] | None:
    """What names a database in ``url``, whatever the driver; None: a private in-memory one."""
    backend = "mysql" if url.get_backend_name() == "mariadb" else url.get_backend_name()
    database = url.database or ""
    if backend == "sqlite":
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            return None
        return backend, os.path.realpath(database)
    return backend, url.host or "", url.port or _DEFAULT_PORTS.get(backend), database, url.username or ""


def check_same_database(ours: Engine, theirs: Engine) -> None:
    """Raise `ConfigError` unless ``theirs`` reaches the database of ``ours`` (the broker's)."""
    if theirs is ours:
        return
    mine = _identity(ours.url)
    if mine is not None and mine == _identity(theirs.url):
        return
    raise ConfigError(
        "enqueue_in: the session or connection is bound to "
        f"{theirs.url.render_as_string(hide_password=True)}, not to the broker's database "
        f"{ours.url.render_as_string(hide_password=True)}; nothing was written"
    )


def store_in(tx: Tx, submit: Submit, channel: str) -> list[dict[str, Any]]:
    """Insert ``submit.tasks`` in ``tx``'s (the application's) transaction, after checking
    its ``max_pending`` (`QueueFullError`: nothing written); the rows stored."""
    # Ids checked first: a taken one must be named, not fail the application's transaction.
    rows = create.store_new(tx, submit.tasks, check_ids=True, room=submit)
    if tx.woken:
        tx.traits.notify(tx.conn, channel, sorted(tx.woken))
    return rows
