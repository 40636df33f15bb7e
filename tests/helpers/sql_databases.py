"""Server databases for SQL broker tests that share one database across many tests.

A fresh database per test (the ``postgresql_url``/``mysql_url`` fixtures) costs a CREATE
DATABASE plus taskgate's DDL every time; the 200 contract tests instead share one database
per module, created here with a unique name, and `empty_tables` wipes taskgate's rows between
tests. The rows are really committed and deleted (not rolled back), so SKIP LOCKED races in
the tests are real.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
from sqlalchemy import create_engine, delete, update

from taskgate.brokers.sql.engine import normalize_url
from taskgate.models import models_for

__all__ = [
    "MYSQL_URL",
    "POSTGRES_HOST",
    "POSTGRES_PORT",
    "empty_tables",
    "fresh_postgresql_url",
    "mysql_database",
    "postgresql_database",
    "require_mysql",
    "require_postgresql",
]

# The same settings as tests/conftest.py (importing a conftest by name is ambiguous: there
# are several), read from the same environment variables.
POSTGRES_HOST = os.environ.get("TASKGATE_TEST_PG_HOST", "127.0.0.1")
POSTGRES_PORT = int(os.environ.get("TASKGATE_TEST_PG_PORT", "5432"))
MYSQL_URL = os.environ.get("TASKGATE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306")


def _require(name: str, host: str, port: int) -> None:
    """Skip (locally) or fail (in CI) when the server is not reachable, as tests/conftest.py does."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return
    except OSError:
        message = f"{name} is not reachable at {host}:{port}"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must run every backend", pytrace=False)
    pytest.skip(message)


def require_postgresql() -> None:
    """Skip or fail (CI) unless the test PostgreSQL is reachable."""
    _require("PostgreSQL", POSTGRES_HOST, POSTGRES_PORT)


def require_mysql() -> None:
    """Skip or fail (CI) unless the test MariaDB/MySQL is reachable."""
    parts = urlsplit(MYSQL_URL.replace("mysql+pymysql", "mysql"))
    _require("MariaDB/MySQL", parts.hostname or "127.0.0.1", parts.port or 3306)


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


@pytest.fixture
def fresh_postgresql_url() -> Iterator[str]:
    """A fresh PostgreSQL database with a unique name (safe when test runs overlap)."""
    require_postgresql()
    with postgresql_database(POSTGRES_HOST, POSTGRES_PORT) as url:
        yield url
