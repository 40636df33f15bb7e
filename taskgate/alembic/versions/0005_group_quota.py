"""A group's quota window on its queue limits row.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05

``<prefix>queue_limits`` gains ``quota_window`` (the start of the epoch-aligned window the
group's quota units were last taken from) and ``quota_used`` (units taken from it), so the
row of a group of a queue holds all that group's shared limits but its slots: the start rate,
and the quota (``QueueConfig.group_quota_limit``). Both NULL on existing rows: nothing taken.

A frozen copy: the columns are spelled out here rather than read from the live models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from taskgate.alembic import table_prefix

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    """Add the two columns."""
    with op.batch_alter_table(f"{table_prefix()}queue_limits") as limits:
        limits.add_column(sa.Column("quota_window", _TIME, nullable=True))
        limits.add_column(sa.Column("quota_used", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop the two columns."""
    with op.batch_alter_table(f"{table_prefix()}queue_limits") as limits:
        limits.drop_column("quota_used")
        limits.drop_column("quota_window")
