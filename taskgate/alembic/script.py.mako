"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

Table names carry the run's prefix: build them with ``table_prefix()``, never literally.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
from taskgate.alembic import table_prefix

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    """${message}"""
    p = table_prefix()
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    """Undo: ${message}"""
    p = table_prefix()
    ${downgrades if downgrades else "pass"}
