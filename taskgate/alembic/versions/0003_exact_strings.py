"""MySQL/MariaDB: string columns compare exactly, trailing spaces included (NO PAD collation).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04

``utf8mb4_bin``, the collation 0001 gave every table, is a PAD SPACE collation: it compares
'k' and 'k ' as equal. Two business keys differing only by trailing spaces collided in the
business-keys primary key (`TaskExistsError` naming the other key), ``history('k')`` listed
the executions of 'k ', and a claim of queue 'jobs ' leased tasks of 'jobs'. Every VARCHAR
column now has the server's NO PAD binary collation: ``utf8mb4_nopad_bin`` on MariaDB,
``utf8mb4_0900_bin`` on MySQL 8 (told apart on the live connection; for ``--sql`` output
against MariaDB use a ``mariadb://`` URL). Rows are kept as they are: a NO PAD collation tells
apart every pair of values the PAD SPACE one did, so no key can collide on the way up.

MySQL refuses to change the collation of a column a foreign key joins, so the foreign keys
are dropped, the columns changed (one ALTER TABLE per table, each rebuilding its table) and
the foreign keys made again. PostgreSQL and SQLite already compare strings exactly: there the
revision changes nothing but the recorded version.

The downgrade restores ``utf8mb4_bin``; it fails with a duplicate-key error if keys or ids that
differ only by trailing spaces were stored meanwhile.

A frozen copy: the columns are spelled out here rather than read from the live models.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy.engine import Dialect

from taskgate.alembic import table_prefix

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# table suffix -> its VARCHAR columns as (name, length, nullable), as 0001 made them.
_STRINGS: dict[str, list[tuple[str, int, bool]]] = {
    "tasks": [
        ("id", 255, False),
        ("type", 255, False),
        ("queue", 255, False),
        ("status", 16, False),
        ("business_key", 255, True),
        ("replay_of", 255, True),
    ],
    "task_deps": [("child_id", 255, False), ("parent_id", 255, False)],
    "leases": [("task_id", 255, False), ("token", 64, False)],
    "quota_windows": [("quota_key", 255, False)],
    "business_keys": [("business_key", 255, False), ("execution_id", 255, False)],
}

# (table suffix, column): the foreign keys of 0001, each naming tasks.id.
_FOREIGN_KEYS = [
    ("tasks", "replay_of"),
    ("task_deps", "child_id"),
    ("task_deps", "parent_id"),
    ("leases", "task_id"),
    ("business_keys", "execution_id"),
]

_PADDED = "utf8mb4_bin"


def upgrade() -> None:
    """Give every VARCHAR column the NO PAD binary collation (MySQL/MariaDB only)."""
    dialect = op.get_context().dialect
    if dialect.name in ("mysql", "mariadb"):
        _collate(_exact(dialect))


def downgrade() -> None:
    """Give the VARCHAR columns back the table's ``utf8mb4_bin`` (MySQL/MariaDB only)."""
    if op.get_context().dialect.name in ("mysql", "mariadb"):
        _collate(_PADDED)


def _exact(dialect: Dialect) -> str:
    """MariaDB's or MySQL 8's NO PAD binary collation (neither server knows the other's)."""
    return "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"


def _collate(collation: str) -> None:
    p = table_prefix()
    tasks = f"{p}tasks"
    for suffix, column in _FOREIGN_KEYS:
        op.drop_constraint(f"fk_{p}{suffix}_{column}", f"{p}{suffix}", type_="foreignkey")
    for suffix, columns in _STRINGS.items():
        changes = ", ".join(
            f"MODIFY `{name}` VARCHAR({length}) CHARACTER SET utf8mb4 COLLATE {collation} "
            f"{'NULL' if nullable else 'NOT NULL'}"
            for name, length, nullable in columns
        )
        op.execute(f"ALTER TABLE `{p}{suffix}` {changes}")
    for suffix, column in _FOREIGN_KEYS:
        op.create_foreign_key(f"fk_{p}{suffix}_{column}", f"{p}{suffix}", tasks, [column], ["id"])
