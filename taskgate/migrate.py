"""``taskgate-migrate``: run taskgate's alembic migrations from an installed package.

    taskgate-migrate upgrade <url> [--revision head] [--prefix taskgate_] [--sql]
    taskgate-migrate downgrade <url> <revision> [--prefix …] [--sql]
    taskgate-migrate current <url> [--prefix …]
    taskgate-migrate history

The same operations are importable (`upgrade`, `downgrade`) for deploy scripts and tests;
they also accept an open SQLAlchemy `Connection`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

from taskgate.alembic import PREFIX_OPTION, SCRIPT_LOCATION
from taskgate.models import DEFAULT_PREFIX, check_prefix

__all__ = ["alembic_config", "downgrade", "main", "upgrade"]


def alembic_config(url_or_connection: str | Connection | None = None, prefix: str = DEFAULT_PREFIX) -> Config:
    """An alembic `Config` for taskgate's migrations on ``url_or_connection`` under ``prefix``."""
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes[PREFIX_OPTION] = check_prefix(prefix)
    if isinstance(url_or_connection, Connection):
        config.attributes["connection"] = url_or_connection
    elif url_or_connection is not None:
        config.attributes["taskgate_url"] = url_or_connection
    return config


def upgrade(
    url_or_connection: str | Connection,
    revision: str = "head",
    *,
    prefix: str = DEFAULT_PREFIX,
    sql: bool = False,
) -> None:
    """Migrate taskgate's tables up to ``revision`` (``sql``: print the SQL instead)."""
    command.upgrade(alembic_config(url_or_connection, prefix), revision, sql=sql)


def downgrade(
    url_or_connection: str | Connection, revision: str, *, prefix: str = DEFAULT_PREFIX, sql: bool = False
) -> None:
    """Migrate taskgate's tables down to ``revision`` (``base`` drops them all)."""
    command.downgrade(alembic_config(url_or_connection, prefix), revision, sql=sql)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``taskgate-migrate`` (``taskgate migrate`` under another name, taking the
    database URL and ``--prefix`` after the action); returns the process exit status."""
    from taskgate.cli import migrate_main

    return migrate_main(argv)


if __name__ == "__main__":
    sys.exit(main())
