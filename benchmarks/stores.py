"""Isolated stores, one per measured run: a fresh database, temp file or Redis key prefix.

A `Store` is JSON-able data (``spec``) that this process and child processes turn into
brokers on the same store (`open_spec`), and it is removed when its context ends, whatever
happened. Servers are found at the same addresses as the tests' (overridable from the
environment with the same variables).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from taskgate.brokers.base import Broker

__all__ = ["BACKENDS", "CROSS_PROCESS", "Store", "isolated_store", "open_spec", "server_address"]

BACKENDS = ("memory", "sqlite", "postgresql", "mariadb", "redis")
# The memory broker lives in one process; no second process can share its tasks.
CROSS_PROCESS = ("sqlite", "postgresql", "mariadb", "redis")

PG_HOST = os.environ.get("TASKGATE_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("TASKGATE_TEST_PG_PORT", "5432"))
MYSQL_URL = os.environ.get("TASKGATE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306")
REDIS_URL = os.environ.get("TASKGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def server_address(backend: str) -> tuple[str, int] | None:
    """Host and port of a server backend (None for memory and SQLite)."""
    if backend == "postgresql":
        return PG_HOST, PG_PORT
    if backend == "mariadb":
        parts = urlsplit(MYSQL_URL.replace("mysql+pymysql", "mysql"))
        return parts.hostname or "127.0.0.1", parts.port or 3306
    if backend == "redis":
        parts = urlsplit(REDIS_URL)
        return parts.hostname or "127.0.0.1", parts.port or 6379
    return None


def open_spec(spec: dict[str, Any]) -> Broker:
    """A new broker (own connections) on the store ``spec`` describes."""
    kind = spec["kind"]
    if kind == "memory":
        from taskgate.brokers.memory import MemoryBroker

        return MemoryBroker()
    if kind == "sql":
        from taskgate.brokers.sql import SQLBroker

        return SQLBroker(spec["url"])
    if kind == "redis":
        from taskgate.brokers.redis import RedisBroker

        return RedisBroker(spec["url"], key_prefix=spec["key_prefix"])
    raise ValueError(f"unknown store kind {kind!r}")


@dataclass
class Store:
    """One isolated store of ``backend``; `open` gives brokers, all closed when the store ends."""

    backend: str
    spec: dict[str, Any]
    opened: list[Broker] = field(default_factory=list)

    def open(self) -> Broker:
        """A NEW broker on this store, closed with the store.

        The memory backend's store IS its broker object, so every call returns that one.
        """
        if self.spec["kind"] == "memory" and self.opened:
            return self.opened[0]
        broker = open_spec(self.spec)
        self.opened.append(broker)
        return broker

    def close_brokers(self) -> None:
        """Close every broker `open` returned (idempotent)."""
        while self.opened:
            self.opened.pop().close()

    @property
    def url(self) -> str:
        """The store's URL (SQLAlchemy URL for SQL stores, redis URL for Redis)."""
        return str(self.spec.get("url", "memory://"))


@contextmanager
def isolated_store(backend: str) -> Iterator[Store]:
    """A fresh store of ``backend`` for one run; everything it holds is removed on exit."""
    makers = {
        "memory": _memory,
        "sqlite": _sqlite,
        "postgresql": _postgresql,
        "mariadb": _mariadb,
        "redis": _redis,
    }
    with makers[backend]() as spec:
        store = Store(backend, spec)
        try:
            yield store
        finally:
            store.close_brokers()


@contextmanager
def _memory() -> Iterator[dict[str, Any]]:
    yield {"kind": "memory"}


@contextmanager
def _sqlite() -> Iterator[dict[str, Any]]:
    directory = tempfile.mkdtemp(prefix="taskgate-bench-")
    try:
        yield {"kind": "sql", "url": f"sqlite:///{directory}/bench.db", "path": f"{directory}/bench.db"}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def unique_name() -> str:
    """A database name no other run uses: ``tg_bench_<10 hex>``."""
    return f"tg_bench_{secrets.token_hex(5)}"


@contextmanager
def _postgresql() -> Iterator[dict[str, Any]]:
    import psycopg

    name = unique_name()
    admin = psycopg.connect(host=PG_HOST, port=PG_PORT, user="postgres", dbname="postgres", autocommit=True)
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        yield {"kind": "sql", "url": f"postgresql+psycopg://postgres@{PG_HOST}:{PG_PORT}/{name}", "db": name}
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def mysql_connect(database: str | None = None, **options: Any) -> Any:
    """A PyMySQL connection to the benchmark MariaDB/MySQL server."""
    import pymysql

    parts = urlsplit(MYSQL_URL.replace("mysql+pymysql", "mysql"))
    return pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=database,
        **options,
    )


@contextmanager
def _mariadb() -> Iterator[dict[str, Any]]:
    name = unique_name()
    admin = mysql_connect(autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        yield {"kind": "sql", "url": f"{MYSQL_URL}/{name}", "db": name}
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()


@contextmanager
def _redis() -> Iterator[dict[str, Any]]:
    import redis

    prefix = f"tgbench{secrets.token_hex(5)}:"
    try:
        yield {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix}
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        try:
            purge_prefix(client, prefix)
        finally:
            client.close()


def purge_prefix(client: Any, prefix: str) -> int:
    """UNLINK every key starting with ``prefix`` (in batches); return how many."""
    escaped = "".join(f"\\{c}" if c in "[]*?\\{}" else c for c in prefix)
    removed = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{escaped}*", count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            removed += client.unlink(*batch)
            batch = []
    if batch:
        removed += client.unlink(*batch)
    return removed
