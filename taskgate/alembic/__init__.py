"""taskgate's alembic migrations, shipped inside the package so an installed taskgate can migrate.

Run them with ``taskgate-migrate upgrade <url>`` (see `taskgate.migrate`) or, in a checkout,
``alembic -x url=<url> upgrade head``. Every table name carries the table prefix (option
``-x prefix=…``, default ``taskgate_``), and the revision is kept in ``<prefix>alembic_version``
so taskgate's migrations never touch the application's own alembic history.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["PREFIX_OPTION", "SCRIPT_LOCATION", "table_prefix"]

SCRIPT_LOCATION = str(Path(__file__).resolve().parent)

# The MigrationContext option env.py sets to the table prefix the migrations must use.
PREFIX_OPTION = "taskgate_prefix"


def table_prefix() -> str:
    """The table prefix of the running migration (call from a migration's upgrade/downgrade)."""
    from alembic import op

    from taskgate.models import check_prefix

    return check_prefix(op.get_context().opts[PREFIX_OPTION])
