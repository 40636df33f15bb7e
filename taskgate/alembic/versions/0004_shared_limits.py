"""Limits shared across processes: queue limit rows, shared slots, a task's group and timeout.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05

- ``<prefix>queue_limits``: one row per queue (and per group of a queue) holding what its
  claims share besides slots: the start rate's theoretical arrival time, a hold (pause or
  queue-wide throttle) and the claimers owed a turn at a free slot.
- ``<prefix>slots``: one row per concurrency slot held under a lease token, expiring with it.
- ``<prefix>tasks.group_name`` and ``<prefix>tasks.timeout_ms``: the group a task's limits
  are counted in, and its own run-time limit in milliseconds (both NULL for existing rows: no group,
  the queue's timeout).

A frozen copy: the columns are spelled out here rather than read from the live models. On
MySQL/MariaDB the new string columns get the NO PAD binary collation revision 0003 gave the
others.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from taskgate.alembic import table_prefix

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_MYSQL = ("mysql", "mariadb")
_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *_MYSQL)
_TEXT = sa.Text().with_variant(mysql.MEDIUMTEXT(), *_MYSQL)
_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}


def upgrade() -> None:
    """Add the two tables and the two task columns."""
    p = table_prefix()
    name, token = _string(255), _string(64)
    with op.batch_alter_table(f"{p}tasks") as tasks:
        tasks.add_column(sa.Column("group_name", name, nullable=True))
        tasks.add_column(sa.Column("timeout_ms", sa.BigInteger(), nullable=True))
    t = f"{p}queue_limits"
    op.create_table(
        t,
        sa.Column("queue", name, nullable=False),
        sa.Column("group_name", name, nullable=False),
        sa.Column("rate_tat", _TIME, nullable=True),
        sa.Column("held_until", _TIME, nullable=True),
        sa.Column("waiters", _TEXT, nullable=True),
        sa.PrimaryKeyConstraint("queue", "group_name", name=f"pk_{t}"),
        **_OPTIONS,
    )
    t = f"{p}slots"
    op.create_table(
        t,
        sa.Column("queue", name, nullable=False),
        sa.Column("token", token, nullable=False),
        sa.Column("group_name", name, nullable=True),
        sa.Column("expires_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("queue", "token", name=f"pk_{t}"),
        **_OPTIONS,
    )


def downgrade() -> None:
    """Drop the two tables and the two task columns."""
    p = table_prefix()
    op.drop_table(f"{p}slots")
    op.drop_table(f"{p}queue_limits")
    with op.batch_alter_table(f"{p}tasks") as tasks:
        tasks.drop_column("timeout_ms")
        tasks.drop_column("group_name")


def _string(length: int) -> sa.types.TypeEngine[str]:
    """``VARCHAR(length)``, with the server's NO PAD binary collation on MySQL/MariaDB."""
    dialect = op.get_context().dialect
    if dialect.name in _MYSQL:
        collation = "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"
        return mysql.VARCHAR(length, collation=collation)
    return sa.String(length)
