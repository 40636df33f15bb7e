"""Initial schema: tasks, dependency edges, leases, quota windows, business keys.

Revision ID: 0001
Revises:
Create Date: 2026-11-30

A frozen copy of the schema as of this revision: it spells its types out rather than
importing the live models, so later model changes can never rewrite history.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from taskgate.alembic import table_prefix

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_MYSQL = ("mysql", "mariadb")
_NAME = sa.String(255)
_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *_MYSQL)
_BLOB = sa.LargeBinary().with_variant(mysql.LONGBLOB(), *_MYSQL)
_TEXT = sa.Text().with_variant(mysql.MEDIUMTEXT(), *_MYSQL)
_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}


def upgrade() -> None:
    """Create the five tables and their indexes."""
    p = table_prefix()
    _create_tasks(p)
    _create_task_deps(p)
    _create_leases(p)
    _create_quota_windows(p)
    _create_business_keys(p)


def downgrade() -> None:
    """Drop the five tables, children first."""
    p = table_prefix()
    for name in ("business_keys", "quota_windows", "leases", "task_deps", "tasks"):
        op.drop_table(f"{p}{name}")


def _create_tasks(p: str) -> None:
    t = f"{p}tasks"
    op.create_table(
        t,
        sa.Column("id", _NAME, nullable=False),
        sa.Column("type", _NAME, nullable=False),
        sa.Column("queue", _NAME, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("ready", sa.Boolean(), nullable=False),
        sa.Column("run_at", _TIME, nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("started_at", _TIME, nullable=True),
        sa.Column("finished_at", _TIME, nullable=True),
        sa.Column("payload", _BLOB, nullable=True),
        sa.Column("result", _BLOB, nullable=True),
        sa.Column("last_error", _TEXT, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_retry", sa.Integer(), nullable=False),
        sa.Column("throttled", sa.Integer(), nullable=False),
        sa.Column("lease_lost", sa.Integer(), nullable=False),
        sa.Column("claims", sa.Integer(), nullable=False),
        sa.Column("ignore_parent_failure", sa.Boolean(), nullable=False),
        sa.Column("depends_on", _TEXT, nullable=False),
        sa.Column("business_key", _NAME, nullable=True),
        sa.Column("replay_of", _NAME, nullable=True),
        sa.PrimaryKeyConstraint("id", name=f"pk_{t}"),
        sa.UniqueConstraint("replay_of", name=f"uq_{t}_replay_of"),
        sa.ForeignKeyConstraint(["replay_of"], [f"{t}.id"], name=f"fk_{t}_replay_of"),
        **_OPTIONS,
    )
    op.create_index(f"ix_{t}_claim", t, ["queue", "ready", "run_at", "id"])
    op.create_index(f"ix_{t}_type_status", t, ["type", "status"])
    op.create_index(f"ix_{t}_status_created", t, ["status", "created_at", "id"])
    op.create_index(f"ix_{t}_created", t, ["created_at", "id"])
    op.create_index(f"ix_{t}_business_key", t, ["business_key", "created_at", "id"])


def _create_task_deps(p: str) -> None:
    t = f"{p}task_deps"
    op.create_table(
        t,
        sa.Column("child_id", _NAME, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("parent_id", _NAME, nullable=False),
        sa.PrimaryKeyConstraint("child_id", "position", name=f"pk_{t}"),
        sa.ForeignKeyConstraint(["child_id"], [f"{p}tasks.id"], name=f"fk_{t}_child_id"),
        sa.ForeignKeyConstraint(["parent_id"], [f"{p}tasks.id"], name=f"fk_{t}_parent_id"),
        **_OPTIONS,
    )
    op.create_index(f"ix_{t}_parent", t, ["parent_id"])


def _create_leases(p: str) -> None:
    t = f"{p}leases"
    op.create_table(
        t,
        sa.Column("task_id", _NAME, nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("expires_at", _TIME, nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("task_id", name=f"pk_{t}"),
        sa.ForeignKeyConstraint(["task_id"], [f"{p}tasks.id"], name=f"fk_{t}_task_id"),
        **_OPTIONS,
    )
    op.create_index(f"ix_{t}_expires", t, ["expires_at", "task_id"])


def _create_quota_windows(p: str) -> None:
    t = f"{p}quota_windows"
    op.create_table(
        t,
        sa.Column("quota_key", _NAME, nullable=False),
        sa.Column("window_start", _TIME, nullable=False),
        sa.Column("window_end", _TIME, nullable=False),
        sa.Column("used", sa.Integer(), nullable=False),
        sa.Column("quota_limit", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("quota_key", "window_start", name=f"pk_{t}"),
        **_OPTIONS,
    )


def _create_business_keys(p: str) -> None:
    t = f"{p}business_keys"
    op.create_table(
        t,
        sa.Column("business_key", _NAME, nullable=False),
        sa.Column("execution_id", _NAME, nullable=False),
        sa.PrimaryKeyConstraint("business_key", name=f"pk_{t}"),
        sa.ForeignKeyConstraint(["execution_id"], [f"{p}tasks.id"], name=f"fk_{t}_execution_id"),
        **_OPTIONS,
    )
    op.create_index(f"ix_{t}_execution", t, ["execution_id"])
