"""PostgreSQL: the claim and business-key indexes become partial.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

On PostgreSQL an update that changes an indexed column (every status change does) writes an
entry into every index whose predicate the new row meets. The claim index now holds only
rows that are ready to claim, and the business-key index only rows that have a key: a claim
and an ack write two index entries fewer per task, and the claim index stays as small as the
backlog however many finished tasks the table keeps. MySQL/MariaDB (no partial indexes) and
SQLite (an update touches only the indexes whose columns it changes) are left as they are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from taskgate.alembic import table_prefix

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# index name suffix -> (columns, predicate)
_PARTIAL = {
    "claim": (["queue", "ready", "run_at", "id"], "ready"),
    "business_key": (["business_key", "created_at", "id"], "business_key IS NOT NULL"),
}


def upgrade() -> None:
    """Rebuild the two indexes with their predicates (PostgreSQL only)."""
    _rebuild(partial=True)


def downgrade() -> None:
    """Rebuild the two indexes over every row again (PostgreSQL only)."""
    _rebuild(partial=False)


def _rebuild(*, partial: bool) -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    t = f"{table_prefix()}tasks"
    for suffix, (columns, predicate) in _PARTIAL.items():
        name = f"ix_{t}_{suffix}"
        op.drop_index(name, table_name=t)
        op.create_index(name, t, columns, postgresql_where=sa.text(predicate) if partial else None)
