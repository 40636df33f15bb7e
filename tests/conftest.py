"""Fixtures shared by every test layer: the anyio backends and the real servers.

A server that cannot be reached skips its tests on a developer's machine and FAILS them in CI
(``CI`` set), so a green CI run always means every backend ran. Server databases are made with
unique names (PostgreSQL through pytest-postgresql's janitor), so overlapping runs stay apart.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from helpers.sql_databases import (
    REDIS_URL,
    mysql_database,
    postgresql_database,
    require_mysql,
    require_postgresql,
    require_redis,
)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every async test under asyncio and under Trio."""
    return str(request.param)


@pytest.fixture
def postgresql_url() -> Iterator[str]:
    """A SQLAlchemy URL (psycopg 3) of a fresh PostgreSQL database, dropped after the test."""
    require_postgresql()
    with postgresql_database() as url:
        yield url


@pytest.fixture
def mysql_url() -> Iterator[str]:
    """A SQLAlchemy URL (PyMySQL) of a fresh MariaDB/MySQL database, dropped after the test."""
    require_mysql()
    with mysql_database() as url:
        yield url


@pytest.fixture
def redis_url() -> str:
    """The URL of the shared Redis; tests isolate themselves with a random key prefix."""
    require_redis()
    return REDIS_URL


@pytest.fixture
def unique_prefix() -> str:
    """A short random identifier-safe prefix for keys or tables of one test."""
    return f"t{secrets.token_hex(4)}_"
