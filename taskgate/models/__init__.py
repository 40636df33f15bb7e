"""taskgate's tables as SQLAlchemy 2.x declarative models, under any table prefix.

The SQL broker uses `models_for` (taskgate's own `MetaData`). An application that manages its
schema with its own alembic mounts the tables into its `MetaData` instead, so autogenerate
sees them::

    from taskgate.models import mount
    taskgate_models = mount(Base.metadata, prefix="taskgate_")

and passes `include_object` to its env.py's ``context.configure`` so that autogenerate leaves
taskgate's own version table alone (`taskgate.models.autogenerate`).
"""

from __future__ import annotations

from taskgate.models.autogenerate import include_object
from taskgate.models.build import (
    DEFAULT_PREFIX,
    NAMING_CONVENTION,
    TABLE_NAMES,
    Models,
    build_models,
    check_prefix,
    models_for,
    mount,
)
from taskgate.models.columns import (
    BusinessKeyColumns,
    DependencyColumns,
    LeaseColumns,
    QueueLimitColumns,
    QuotaWindowColumns,
    SlotColumns,
    StepColumns,
    TaskColumns,
)

__all__ = [
    "DEFAULT_PREFIX",
    "NAMING_CONVENTION",
    "SCHEMA_REVISION",
    "TABLE_NAMES",
    "BusinessKeyColumns",
    "DependencyColumns",
    "LeaseColumns",
    "Models",
    "QueueLimitColumns",
    "QuotaWindowColumns",
    "SlotColumns",
    "StepColumns",
    "TaskColumns",
    "build_models",
    "check_prefix",
    "include_object",
    "models_for",
    "mount",
]

# The alembic revision these models correspond to; a test checks it is the migrations' head.
SCHEMA_REVISION = "0007"
