"""Creating taskgate's tables on first use, or checking that a migrated schema is current.

taskgate keeps its alembic revision in ``<prefix>alembic_version`` (alembic's own layout), so
tables made here and tables made by ``taskgate-migrate`` are interchangeable: a database
created by the broker can be migrated later, and the broker can check a migrated one.
"""

from __future__ import annotations

from sqlalchemy import Column, Connection, Engine, MetaData, PrimaryKeyConstraint, String, Table, inspect

from taskgate.brokers.sql.dialects import Traits
from taskgate.errors import BrokerError
from taskgate.models import SCHEMA_REVISION, Models

__all__ = ["SchemaError", "prepare_schema", "version_table"]


class SchemaError(BrokerError):
    """Raised when taskgate's tables are missing or at another revision; the message says the fix."""


def version_table(prefix: str, metadata: MetaData | None = None) -> Table:
    """alembic's version table for ``prefix``, as alembic itself would create it."""
    name = f"{prefix}alembic_version"
    return Table(
        name,
        metadata if metadata is not None else MetaData(),
        Column("version_num", String(32), nullable=False),
        PrimaryKeyConstraint("version_num", name=f"{name}_pkc"),
    )


def prepare_schema(engine: Engine, models: Models, traits: Traits, *, create: bool) -> None:
    """Create missing tables (``create``) under a lock, then check the schema revision."""
    versions = version_table(models.prefix)
    with traits.schema_transaction(engine, f"{models.prefix}schema") as conn:
        # A schema at another revision is left exactly as it is: tables of a newer revision
        # made beside older ones would stop its migration (they would exist already), and DDL
        # is not undone by a rollback on MySQL.
        if create and _recorded_revision(conn, versions) in (None, SCHEMA_REVISION):
            models.metadata.create_all(conn, tables=models.tables, checkfirst=True)
            versions.create(conn, checkfirst=True)
            _stamp_if_new(conn, versions)
        _check_revision(conn, engine, models, versions)


def _recorded_revision(conn: Connection, versions: Table) -> str | None:
    """The revision in the version table; None when there is no table or no row yet."""
    if not inspect(conn).has_table(versions.name):
        return None
    revision: str | None = conn.execute(versions.select().limit(1)).scalar()
    return revision


def _stamp_if_new(conn: Connection, versions: Table) -> None:
    if conn.execute(versions.select().limit(1)).first() is None:
        conn.execute(versions.insert().values(version_num=SCHEMA_REVISION))


def _check_revision(conn: Connection, engine: Engine, models: Models, versions: Table) -> None:
    inspector = inspect(conn)
    current: str | None = None
    if inspector.has_table(versions.name):
        current = conn.execute(versions.select().limit(1)).scalar()
    elif all(inspector.has_table(t.name) for t in models.tables):
        # Migrated by the application's own alembic (tables mounted into its MetaData).
        return
    if current != SCHEMA_REVISION:
        url = engine.url.render_as_string(hide_password=True)
        prefix = "" if models.prefix == "taskgate_" else f" --prefix {models.prefix}"
        # create_tables=True makes missing tables; it never migrates tables that are behind.
        alternative = " (or construct SQLBroker with create_tables=True)" if current is None else ""
        raise SchemaError(
            f"taskgate schema (prefix {models.prefix!r}) is at {current or 'nothing'}, need "
            f"{SCHEMA_REVISION}: run `taskgate-migrate upgrade {url}{prefix}`{alternative}"
        )
