"""Scheduling and durable execution (issue 39).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05

- ``<prefix>steps``: the durable steps of a handler (``taskgate.step``), one row per task and
  step name holding the JSON result its first run stored; keyed by (task_id, name), task_id a
  foreign key to ``<prefix>tasks`` (a task's steps are deleted with it by retention).
- Priorities: ``<prefix>tasks`` gains ``priority`` INTEGER NOT NULL, server default 0 (existing
  rows, and rows an older version writes during a rolling deploy, get 0). The claim index
  ``ix_<prefix>tasks_claim`` is rebuilt as (queue, ready, priority DESC, run_at, id) -- partial
  ``WHERE ready`` on PostgreSQL, as 0002 made it -- so a claim reads its tasks in claim order
  (highest priority, then oldest due, then id) and stops after k rows, without a sort.

A frozen copy: the columns are spelled out here rather than read from the live models. On
MySQL/MariaDB the string columns get the NO PAD binary collation revision 0003 gave the others.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from taskgate.alembic import table_prefix

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_MYSQL = ("mysql", "mariadb")
_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *_MYSQL)
_BLOB = sa.LargeBinary().with_variant(mysql.LONGBLOB(), *_MYSQL)
_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}


def upgrade() -> None:
    """Create the steps table; add ``priority`` and rebuild the claim index with it."""
    _create_steps(table_prefix())
    _add_priority(table_prefix())


def downgrade() -> None:
    """Drop ``priority`` (the claim index rebuilt without it) and the steps table."""
    _drop_priority(table_prefix())
    op.drop_table(f"{table_prefix()}steps")


def _create_steps(p: str) -> None:
    t = f"{p}steps"
    name = _string(255)
    op.create_table(
        t,
        sa.Column("task_id", name, nullable=False),
        sa.Column("name", name, nullable=False),
        sa.Column("result", _BLOB, nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("task_id", "name", name=f"pk_{t}"),
        sa.ForeignKeyConstraint(["task_id"], [f"{p}tasks.id"], name=f"fk_{t}_task_id"),
        **_OPTIONS,
    )


def _string(length: int) -> sa.types.TypeEngine[str]:
    """``VARCHAR(length)``, with the server's NO PAD binary collation on MySQL/MariaDB."""
    dialect = op.get_context().dialect
    if dialect.name in _MYSQL:
        collation = "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"
        return mysql.VARCHAR(length, collation=collation)
    return sa.String(length)


def _add_priority(p: str) -> None:
    t = f"{p}tasks"
    with op.batch_alter_table(t) as tasks:
        tasks.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default=sa.text("0")))
    _rebuild_claim_index(t, ["queue", "ready", sa.desc(sa.column("priority")), "run_at", "id"])


def _drop_priority(p: str) -> None:
    t = f"{p}tasks"
    _rebuild_claim_index(t, ["queue", "ready", "run_at", "id"])
    with op.batch_alter_table(t) as tasks:
        tasks.drop_column("priority")


def _rebuild_claim_index(table: str, columns: list[sa.ColumnElement[object] | str]) -> None:
    name = f"ix_{table}_claim"
    partial = sa.text("ready") if op.get_context().dialect.name == "postgresql" else None
    op.drop_index(name, table_name=table)
    op.create_index(name, table, columns, postgresql_where=partial)
