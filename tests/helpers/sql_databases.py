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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
from sqlalchemy import Engine, create_engine, delete, update

from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.engine import normalize_url
from taskgate.clock import Clock
from taskgate.models import models_for

__all__ = [
    "MYSQL_URL",
    "POSTGRES_HOST",
    "POSTGRES_PORT",
    "REDIS_URL",
    "empty_tables",
    "make_tables",
    "mysql_database",
    "postgresql_database",
    "require_mysql",
    "require_postgresql",
    "require_redis",
    "require_server",
    "sql_brokers",
]

# Settings of the test servers, overridable from the environment.
POSTGRES_HOST = os.environ.get("TASKGATE_TEST_PG_HOST", "127.0.0.1")
POSTGRES_PORT = int(os.environ.get("TASKGATE_TEST_PG_PORT", "5432"))
MYSQL_URL = os.environ.get("TASKGATE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306")
REDIS_URL = os.environ.get("TASKGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def require_server(name: str, host: str, port: int) -> None:
    """Skip (locally) or fail (in CI, ``CI`` set) when ``name`` at host:port is not reachable."""
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
    require_server("PostgreSQL", POSTGRES_HOST, POSTGRES_PORT)


def require_mysql() -> None:
    """Skip or fail (CI) unless the test MariaDB/MySQL is reachable."""
    parts = urlsplit(MYSQL_URL.replace("mysql+pymysql", "mysql"))
    require_server("MariaDB/MySQL", parts.hostname or "127.0.0.1", parts.port or 3306)


def require_redis() -> None:
    """Skip or fail (CI) unless the test Redis is reachable."""
    parts = urlsplit(REDIS_URL)
    require_server("Redis", parts.hostname or "127.0.0.1", parts.port or 6379)


@contextmanager
def postgresql_database(host: str = POSTGRES_HOST, port: int = POSTGRES_PORT) -> Iterator[str]:
    """A new, uniquely named PostgreSQL database made by pytest-postgresql's janitor; dropped on exit.

    Unique names keep overlapping test runs on one server apart.
    """
    from pytest_postgresql.janitor import DatabaseJanitor

    name = f"tg_sql_{secrets.token_hex(5)}"
    with DatabaseJanitor(user="postgres", host=host, port=port, dbname=name):
        yield f"postgresql+psycopg://postgres@{host}:{port}/{name}"


@contextmanager
def mysql_database(server_url: str = MYSQL_URL) -> Iterator[str]:
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


def make_tables(url_or_engine: str | Engine) -> None:
    """Let a broker create taskgate's tables (its first call does, never its constructor)."""
    broker = SQLBroker(url_or_engine)
    try:
        broker.counts()
    finally:
        broker.close()


def empty_tables(url: str, prefix: str = "taskgate_") -> None:
    """Delete every row of taskgate's tables (children first), keeping the schema."""
    m = models_for(prefix)
    engine = create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            for model in (
                m.lease,
                m.dependency,
                m.business_key,
                m.quota_window,
                m.queue_limit,
                m.slot,
                m.step,
            ):
                conn.execute(delete(model))
            # Replays point at other rows of the same table: unlink them before deleting.
            conn.execute(update(m.task).where(m.task.replay_of.is_not(None)).values(replay_of=None))
            conn.execute(delete(m.task))
    finally:
        engine.dispose()


@contextmanager
def sql_brokers(url: str, clock: Clock) -> Iterator[Callable[[], SQLBroker]]:
    """A contract-suite broker factory: each call opens a new `SQLBroker` on ``url``; all closed on exit."""
    opened: list[SQLBroker] = []

    def open_broker() -> SQLBroker:
        broker = SQLBroker(url, clock=clock, poll_interval=0.02)
        opened.append(broker)
        return broker

    try:
        yield open_broker
    finally:
        for broker in opened:
            broker.close()
