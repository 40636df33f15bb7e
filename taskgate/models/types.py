"""Column types that behave the same on SQLite, PostgreSQL and MySQL/MariaDB.

An application that mounts taskgate's tables (`taskgate.models.mount`) gets these types written
into the migrations its alembic autogenerates, so their names and constructor arguments are
kept stable: ``ExactString(length=...)`` and ``UTCDateTime(timezone=True)``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from sqlalchemy import DateTime, LargeBinary, String, Text
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from taskgate.clock import utc

__all__ = [
    "MARIADB_EXACT_COLLATION",
    "MYSQL_DIALECTS",
    "MYSQL_EXACT_COLLATION",
    "RENDERED_MODULE",
    "Blob",
    "ExactString",
    "LongText",
    "UTCDateTime",
    "exact_collation",
]

MYSQL_DIALECTS = ("mysql", "mariadb")

_T = TypeVar("_T")

# alembic's autogenerate writes a type from outside SQLAlchemy as ``<its __module__>.<repr>``
# and adds no import for it, so ``taskgate.models.types.UTCDateTime(...)`` failed with a
# NameError in an app's migration. Each instance names its module by an expression that
# imports it (the class keeps its real ``__module__``), so the migration runs as generated
# without a hook in the app's env.py. (An env.py setting ``user_module_prefix`` replaces
# this prefix for every type, taskgate's too.)
RENDERED_MODULE = "__import__('taskgate.models.types').models.types"

# MySQL's BLOB/TEXT stop at 64 KiB; payloads and errors need more room there.
Blob = LargeBinary().with_variant(mysql.LONGBLOB(), *MYSQL_DIALECTS)
LongText = Text().with_variant(mysql.MEDIUMTEXT(), *MYSQL_DIALECTS)

# Binary collations WITHOUT pad space. ``utf8mb4_bin`` is a PAD SPACE collation: it compares
# 'k' and 'k ' as equal, so two business keys, ids or queues differing only by trailing
# spaces would collide in a primary key or match each other's look-ups. MariaDB (>= 10.2) and
# MySQL 8 name their NO PAD binary collation differently, and neither knows the other's.
MARIADB_EXACT_COLLATION = "utf8mb4_nopad_bin"
MYSQL_EXACT_COLLATION = "utf8mb4_0900_bin"


def exact_collation(dialect: Dialect) -> str:
    """The NO PAD binary collation of the server behind ``dialect`` (MariaDB's or MySQL 8's).

    A ``mysql://`` URL may reach a MariaDB server: SQLAlchemy tells which once connected.
    """
    return MARIADB_EXACT_COLLATION if getattr(dialect, "is_mariadb", False) else MYSQL_EXACT_COLLATION


class _RenderedImportably(TypeDecorator[_T]):
    """A type alembic writes into a migration as an expression that imports its module."""

    cache_ok = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.__module__ = RENDERED_MODULE


class ExactString(_RenderedImportably[str]):
    """A ``VARCHAR(length)`` compared byte for byte on every database, trailing spaces included.

    SQLite and PostgreSQL compare strings so already; on MySQL/MariaDB the column gets the
    server's NO PAD binary collation (`exact_collation`), chosen when the DDL is compiled, so
    tables made on first use and by the migrations (revision 0003) agree.
    """

    impl = String
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        """``VARCHAR(n) COLLATE <no pad binary>`` on MySQL/MariaDB, a plain ``VARCHAR(n)`` elsewhere."""
        if dialect.name in MYSQL_DIALECTS:
            length = cast(String, self.impl_instance).length
            return dialect.type_descriptor(mysql.VARCHAR(length, collation=exact_collation(dialect)))
        return dialect.type_descriptor(self.impl_instance)


class UTCDateTime(_RenderedImportably[datetime]):
    """A point in time stored as UTC with microseconds, always read back timezone-aware.

    PostgreSQL keeps ``timestamptz`` (so the session time zone never matters); MySQL keeps a
    naive UTC ``DATETIME(6)`` and SQLite a naive UTC ISO string, which sorts correctly as text.
    Naive values are refused on the way in: a naive datetime is a bug we cannot repair.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        """``DATETIME(6)`` on MySQL (its default drops microseconds), ``timestamptz`` elsewhere."""
        if dialect.name in MYSQL_DIALECTS:
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Convert an aware datetime to UTC; naive for the dialects that store no zone."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"taskgate stores timezone-aware datetimes only, got naive {value!r}")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Read back as an aware UTC datetime."""
        return None if value is None else utc(value)

    # SQLite: one function each way instead of SQLAlchemy's processor wrapped around ours.
    # Every claimed or finished task row carries four of these, and the layered conversion
    # cost more than the statement that read them. Same text as SQLAlchemy's SQLite DATETIME
    # (``YYYY-MM-DD HH:MM:SS.ffffff``, microseconds always written), so stored values compare
    # and sort with the ones written before.

    def bind_processor(self, dialect: Dialect) -> Callable[[datetime | None], Any] | None:
        """UTC text on SQLite; ``process_bind_param`` then the dialect's own elsewhere."""
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)

        def to_text(value: datetime | None) -> str | None:
            if value is None:
                return None
            if value.tzinfo is None:
                raise ValueError(f"taskgate stores timezone-aware datetimes only, got naive {value!r}")
            return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")

        return to_text

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], datetime | None] | None:
        """Aware UTC from SQLite's text; the dialect's own then ``process_result_value`` elsewhere."""
        if dialect.name != "sqlite":
            return super().result_processor(dialect, coltype)

        def from_text(value: str | None) -> datetime | None:
            return None if value is None else datetime.fromisoformat(value).replace(tzinfo=UTC)

        return from_text
