"""Scheduling (issue 39): task priorities.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05

Priorities: ``<prefix>tasks`` gains ``priority`` INTEGER NOT NULL, server default 0 (existing
rows, and rows an older version writes during a rolling deploy, get 0). The claim index
``ix_<prefix>tasks_claim`` is rebuilt as (queue, ready, priority DESC, run_at, id) -- partial
``WHERE ready`` on PostgreSQL, as 0002 made it -- so a claim reads its tasks in claim order
(highest priority, then oldest due, then id) and stops after k rows, without a sort.

A frozen copy: the columns are spelled out here rather than read from the live models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from taskgate.alembic import table_prefix

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``priority`` and rebuild the claim index with it."""
    t = f"{table_prefix()}tasks"
    with op.batch_alter_table(t) as tasks:
        tasks.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default=sa.text("0")))
    _rebuild_claim_index(t, ["queue", "ready", sa.desc(sa.column("priority")), "run_at", "id"])


def downgrade() -> None:
    """Rebuild the claim index without ``priority``, then drop the column."""
    t = f"{table_prefix()}tasks"
    _rebuild_claim_index(t, ["queue", "ready", "run_at", "id"])
    with op.batch_alter_table(t) as tasks:
        tasks.drop_column("priority")


def _rebuild_claim_index(table: str, columns: list[sa.ColumnElement[object] | str]) -> None:
    name = f"ix_{table}_claim"
    partial = sa.text("ready") if op.get_context().dialect.name == "postgresql" else None
    op.drop_index(name, table_name=table)
    op.create_index(name, table, columns, postgresql_where=partial)
