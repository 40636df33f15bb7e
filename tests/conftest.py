"""Fixtures shared by every test layer: the anyio backends and the real servers.

A server that cannot be reached skips its tests on a developer's machine and FAILS them in CI
(``CI`` set), so a green CI run always means every backend ran.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from pytest_postgresql import factories

IN_CI = bool(os.environ.get("CI"))

POSTGRES_HOST = os.environ.get("TASKGATE_TEST_PG_HOST", "127.0.0.1")
POSTGRES_PORT = int(os.environ.get("TASKGATE_TEST_PG_PORT", "5432"))
MYSQL_URL = os.environ.get("TASKGATE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306")
REDIS_URL = os.environ.get("TASKGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def require_server(name: str, host: str, port: int) -> None:
    """Skip (locally) or fail (in CI) when the server ``name`` at host:port is not reachable."""
    if _reachable(host, port):
        return
    message = f"{name} is not reachable at {host}:{port}"
    if IN_CI:
        pytest.fail(f"{message}; CI must run every backend", pytrace=False)
    pytest.skip(message)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every async test under asyncio and under Trio."""
    return str(request.param)


postgresql_noproc = factories.postgresql_noproc(
    host=POSTGRES_HOST, port=POSTGRES_PORT, user="postgres", dbname="test"
)
postgresql = factories.postgresql("postgresql_noproc")


@pytest.fixture
def postgresql_url(request: pytest.FixtureRequest) -> str:
    """A SQLAlchemy URL (psycopg 3) of a fresh PostgreSQL database, dropped after the test."""
    require_server("PostgreSQL", POSTGRES_HOST, POSTGRES_PORT)
    conn = request.getfixturevalue("postgresql")
    info = conn.info
    return f"postgresql+psycopg://{info.user}@{info.host}:{info.port}/{info.dbname}"


@pytest.fixture
def mysql_url() -> Iterator[str]:
    """A SQLAlchemy URL (PyMySQL) of a fresh MariaDB/MySQL database, dropped after the test."""
    parts = urlsplit(MYSQL_URL.replace("mysql+pymysql", "mysql"))
    require_server("MariaDB/MySQL", parts.hostname or "127.0.0.1", parts.port or 3306)
    import pymysql

    name = f"tg_test_{secrets.token_hex(6)}"
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
        yield f"{MYSQL_URL}/{name}"
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        admin.close()


@pytest.fixture
def redis_url() -> str:
    """The URL of the shared Redis; tests isolate themselves with a random key prefix."""
    parts = urlsplit(REDIS_URL)
    require_server("Redis", parts.hostname or "127.0.0.1", parts.port or 6379)
    return REDIS_URL


@pytest.fixture
def unique_prefix() -> str:
    """A short random identifier-safe prefix for keys or tables of one test."""
    return f"t{secrets.token_hex(4)}_"
