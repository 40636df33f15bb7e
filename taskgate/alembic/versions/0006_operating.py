"""A task's last traceback, progress and trace context (issue 36).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05

``<prefix>tasks`` gains three nullable text columns, NULL on existing rows:

- ``last_traceback``: the formatted traceback of the handler's latest exception, its newest
  8 KiB (``Task.last_traceback``);
- ``progress``: a handler's progress report, a JSON document of at most 64 KiB;
- ``trace_context``: the submitter's trace context (W3C ``traceparent``/``tracestate``).

Retention pruning needs no index of its own: it reads a status's oldest tasks by
``ix_<prefix>tasks_status_created`` (a task finishes after it was created, so every task
finished before a cutoff was created before it too).

A frozen copy: the columns are spelled out here rather than read from the live models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from taskgate.alembic import table_prefix

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_TEXT = sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
_COLUMNS = ("last_traceback", "progress", "trace_context")


def upgrade() -> None:
    """Add the three columns."""
    with op.batch_alter_table(f"{table_prefix()}tasks") as tasks:
        for name in _COLUMNS:
            tasks.add_column(sa.Column(name, _TEXT, nullable=True))


def downgrade() -> None:
    """Drop the three columns."""
    with op.batch_alter_table(f"{table_prefix()}tasks") as tasks:
        for name in reversed(_COLUMNS):
            tasks.drop_column(name)
