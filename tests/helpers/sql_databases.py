"""Server databases for SQL broker tests that share one database across many tests.

A fresh database per test (the ``postgresql_url``/``mysql_url`` fixtures) costs a CREATE
DATABASE plus taskgate's DDL every time; the 200 contract tests instead share one database
per module, created here with a unique name, and `empty_tables` wipes taskgate's rows between
tests. The rows are really committed and deleted (not rolled back), so SKIP LOCKED races in
the tests are real.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from sqlalchemy import create_engine, delete, update

from taskgate.brokers.sql.engine import normalize_url
from taskgate.models import models_for

__all__ = ["empty_tables", "mysql_database", "postgresql_database"]


@contextmanager
def postgresql_database(host: str, port: int) -> Iterator[str]:
    """A new, uniquely named PostgreSQL database (user postgres); dropped on exit."""
    import psycopg

    name = f"tg_sql_{secrets.token_hex(5)}"
    with psycopg.connect(host=host, port=port, user="postgres", dbname="postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"postgresql+psycopg://postgres@{host}:{port}/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def mysql_database(server_url: str) -> Iterator[str]:
    """A new, uniquely named MariaDB/MySQL database (utf8mb4, binary collation); dropped on exit."""
    import pymysql

    parts = urlsplit(server_url.replace("mysql+pymysql", "mysql"))
    name = f"tg_sql_{secrets.token_hex(5)}"
    admin = pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        autocommit=True,
    )
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        yield f"{server_url}/{name}"
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()


def empty_tables(url: str, prefix: str = "taskgate_") -> None:
    """Delete every row of taskgate's tables (children first), keeping the schema."""
    m = models_for(prefix)
    engine = create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            for model in (m.lease, m.dependency, m.business_key, m.quota_window):
                conn.execute(delete(model))
            # Replays point at other rows of the same table: unlink them before deleting.
            conn.execute(update(m.task).where(m.task.replay_of.is_not(None)).values(replay_of=None))
            conn.execute(delete(m.task))
    finally:
        engine.dispose()
