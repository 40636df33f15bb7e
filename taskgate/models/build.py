"""Build the mapped classes under a table prefix, in taskgate's own or an app's `MetaData`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar, cast

from sqlalchemy import (
    ForeignKeyConstraint,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    UniqueConstraint,
    column,
    desc,
    text,
)
from sqlalchemy.orm import DeclarativeBase, registry
from sqlalchemy.sql.elements import conv

from taskgate.errors import ConfigError
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
    "TABLE_NAMES",
    "Models",
    "build_models",
    "check_prefix",
    "models_for",
    "mount",
    "prefixes_in_use",
]

DEFAULT_PREFIX = "taskgate_"

# Identifiers only, and short enough that "ix_" + prefix + the longest table + index name
# stays within PostgreSQL's 63 and MySQL's 64 character limits.
_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,30}$")

TABLE_NAMES = (
    "tasks",
    "task_deps",
    "leases",
    "quota_windows",
    "business_keys",
    "queue_limits",
    "slots",
    "steps",
)

# Every constraint taskgate declares is named explicitly (wrapped in `conv`, so an app's own
# convention cannot rename it); this convention names anything added later the same way.
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}

_M = TypeVar("_M")

# Every prefix whose tables this process has built (mounted or for a broker), and the default.
_PREFIXES_IN_USE: set[str] = {DEFAULT_PREFIX}


def check_prefix(prefix: object) -> str:
    """Return ``prefix`` if it is a safe table prefix, else raise `ConfigError` saying why."""
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise ConfigError(
            f"table_prefix must be an identifier of 1-31 letters, digits or underscores "
            f"not starting with a digit (e.g. 'taskgate_'), got {prefix!r}"
        )
    return prefix


@dataclass(frozen=True, slots=True)
class Models:
    """The mapped classes of one table prefix, and the `MetaData` holding their tables."""

    prefix: str
    metadata: MetaData
    task: type[TaskColumns]
    dependency: type[DependencyColumns]
    lease: type[LeaseColumns]
    quota_window: type[QuotaWindowColumns]
    business_key: type[BusinessKeyColumns]
    queue_limit: type[QueueLimitColumns]
    slot: type[SlotColumns]
    step: type[StepColumns]

    @property
    def tables(self) -> list[Table]:
        """taskgate's tables, parents before children (the order to create them in)."""
        classes = (
            self.task,
            self.dependency,
            self.lease,
            self.quota_window,
            self.business_key,
            self.queue_limit,
            self.slot,
            self.step,
        )
        return [cast(Table, cast(Any, cls).__table__) for cls in classes]


def build_models(prefix: str = DEFAULT_PREFIX, metadata: MetaData | None = None) -> Models:
    """Map taskgate's tables as ``<prefix>tasks`` etc. into ``metadata`` (a new one if None).

    A new `MetaData` gets `NAMING_CONVENTION`. Raises `ConfigError` for a bad prefix and
    SQLAlchemy's ``InvalidRequestError`` if ``metadata`` already holds these tables.
    """
    prefix = check_prefix(prefix)
    _PREFIXES_IN_USE.add(prefix)
    target = metadata if metadata is not None else MetaData(naming_convention=NAMING_CONVENTION)
    base = _declarative_base(target)
    tasks = f"{prefix}tasks"
    return Models(
        prefix=prefix,
        metadata=target,
        task=_map(base, TaskColumns, tasks, _task_args(tasks)),
        dependency=_map(base, DependencyColumns, f"{prefix}task_deps", _dependency_args(prefix, tasks)),
        lease=_map(base, LeaseColumns, f"{prefix}leases", _lease_args(prefix, tasks)),
        quota_window=_map(base, QuotaWindowColumns, f"{prefix}quota_windows", _window_args(prefix)),
        business_key=_map(base, BusinessKeyColumns, f"{prefix}business_keys", _key_args(prefix, tasks)),
        queue_limit=_map(base, QueueLimitColumns, f"{prefix}queue_limits", _queue_limit_args(prefix)),
        slot=_map(base, SlotColumns, f"{prefix}slots", _slot_args(prefix)),
        step=_map(base, StepColumns, f"{prefix}steps", _step_args(prefix, tasks)),
    )


def mount(metadata: MetaData, prefix: str = DEFAULT_PREFIX) -> Models:
    """Add taskgate's tables to an application's own ``metadata``, so its alembic sees them."""
    return build_models(prefix, metadata)


@lru_cache(maxsize=32)
def models_for(prefix: str) -> Models:
    """The models of ``prefix`` in taskgate's own `MetaData`, built once per process."""
    return build_models(prefix)


def prefixes_in_use() -> frozenset[str]:
    """The default prefix and every prefix whose tables this process built (`build_models`)."""
    return frozenset(_PREFIXES_IN_USE)


def _declarative_base(metadata: MetaData) -> type[DeclarativeBase]:
    class Base(DeclarativeBase):
        registry = registry(metadata=metadata)

    return Base


def _map(base: type[DeclarativeBase], columns: type[_M], table: str, args: tuple[Any, ...]) -> type[_M]:
    """A mapped class named after ``table``, with the columns of ``columns`` and ``args``."""
    namespace = {"__tablename__": table, "__table_args__": args}
    return cast(type[_M], type(f"{columns.__name__}_{table}", (columns, base), namespace))


def _options() -> dict[str, str]:
    # Binary collation: ids and keys are case-sensitive on MySQL as everywhere else. The
    # string columns override it with the server's NO PAD binary collation (`ExactString`):
    # utf8mb4_bin pads, so it would take 'k ' for 'k'.
    return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def _task_args(t: str) -> tuple[Any, ...]:
    return (
        PrimaryKeyConstraint("id", name=conv(f"pk_{t}")),
        # At most one execution replays another: a replay chain can never fork.
        UniqueConstraint("replay_of", name=conv(f"uq_{t}_replay_of")),
        ForeignKeyConstraint(["replay_of"], [f"{t}.id"], name=conv(f"fk_{t}_replay_of")),
        # On PostgreSQL every update of a row that changes an indexed column (a status
        # change does) writes an entry into EVERY index whose predicate the new row meets:
        # partial indexes keep finished and running rows out of the claim index, and the
        # many rows without a business key out of that index. (MySQL and SQLite have no
        # such cost -- they only touch indexes whose columns change -- and MySQL has no
        # partial indexes.)
        # The claim's order: highest priority first (a DESC column, so one forward scan reads
        # it), then oldest due, then id.
        Index(
            conv(f"ix_{t}_claim"),
            "queue",
            "ready",
            desc(column("priority")),
            "run_at",
            "id",
            postgresql_where=text("ready"),
        ),
        Index(conv(f"ix_{t}_type_status"), "type", "status"),
        Index(conv(f"ix_{t}_status_created"), "status", "created_at", "id"),
        Index(conv(f"ix_{t}_created"), "created_at", "id"),
        Index(
            conv(f"ix_{t}_business_key"),
            "business_key",
            "created_at",
            "id",
            postgresql_where=text("business_key IS NOT NULL"),
        ),
        _options(),
    )


def _dependency_args(prefix: str, tasks: str) -> tuple[Any, ...]:
    t = f"{prefix}task_deps"
    return (
        PrimaryKeyConstraint("child_id", "position", name=conv(f"pk_{t}")),
        ForeignKeyConstraint(["child_id"], [f"{tasks}.id"], name=conv(f"fk_{t}_child_id")),
        ForeignKeyConstraint(["parent_id"], [f"{tasks}.id"], name=conv(f"fk_{t}_parent_id")),
        Index(conv(f"ix_{t}_parent"), "parent_id"),
        _options(),
    )


def _lease_args(prefix: str, tasks: str) -> tuple[Any, ...]:
    t = f"{prefix}leases"
    return (
        PrimaryKeyConstraint("task_id", name=conv(f"pk_{t}")),
        ForeignKeyConstraint(["task_id"], [f"{tasks}.id"], name=conv(f"fk_{t}_task_id")),
        Index(conv(f"ix_{t}_expires"), "expires_at", "task_id"),
        _options(),
    )


def _window_args(prefix: str) -> tuple[Any, ...]:
    t = f"{prefix}quota_windows"
    return (PrimaryKeyConstraint("quota_key", "window_start", name=conv(f"pk_{t}")), _options())


def _key_args(prefix: str, tasks: str) -> tuple[Any, ...]:
    t = f"{prefix}business_keys"
    return (
        PrimaryKeyConstraint("business_key", name=conv(f"pk_{t}")),
        ForeignKeyConstraint(["execution_id"], [f"{tasks}.id"], name=conv(f"fk_{t}_execution_id")),
        Index(conv(f"ix_{t}_execution"), "execution_id"),
        _options(),
    )


def _queue_limit_args(prefix: str) -> tuple[Any, ...]:
    t = f"{prefix}queue_limits"
    return (PrimaryKeyConstraint("queue", "group_name", name=conv(f"pk_{t}")), _options())


def _slot_args(prefix: str) -> tuple[Any, ...]:
    # A claim reads and clears a queue's slots by the key's first column; a queue has no more
    # rows here than its workers (and the expired ones it clears), so no other index pays.
    t = f"{prefix}slots"
    return (PrimaryKeyConstraint("queue", "token", name=conv(f"pk_{t}")), _options())


def _step_args(prefix: str, tasks: str) -> tuple[Any, ...]:
    # Read and deleted by task id: the key's first column serves both.
    t = f"{prefix}steps"
    return (
        PrimaryKeyConstraint("task_id", "name", name=conv(f"pk_{t}")),
        ForeignKeyConstraint(["task_id"], [f"{tasks}.id"], name=conv(f"fk_{t}_task_id")),
        _options(),
    )
