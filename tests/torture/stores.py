"""The store of one run: a private server (never the shared ones) or an SQLite file.

`open_store(backend, directory)` starts it. ``url(port)`` is its URL through a port (a
worker's proxy, or the server's own); ``restart`` crashes the server (SIGKILL: no clean
shutdown) and starts it again on the same port and data; SQLite has no server, so its runs
have no restarts and no proxies.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pymysql
from helpers.mariadb_servers import MariaDBServer
from helpers.pg_servers import PostgresServer
from helpers.redis_servers import RedisServer

__all__ = ["BACKENDS", "Store", "open_store"]

BACKENDS = ("sqlite", "postgresql", "mysql", "redis")


class Store:
    """Base: a store with no server (SQLite)."""

    name = "sqlite"
    has_server = False
    # How long before a server crash a claim it answered may still be undone by it (seconds).
    undo_window = 0.0

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = 0
        self.options: dict[str, Any] = {}

    def url(self, port: int | None = None) -> str:
        """The broker URL, through ``port`` (default: the server's own)."""
        return f"sqlite:///{self.directory / 'tasks.db'}"

    def restart(self) -> None:
        """Crash the server and start it again."""
        raise NotImplementedError("SQLite has no server to restart")

    def stop(self) -> None:
        """Stop the server and remove its files."""


class PostgresStore(Store):
    """A private PostgreSQL (``helpers.pg_servers.PostgresServer``)."""

    name, has_server = "postgresql", True
    # A plain claim commits without waiting for the disk (`taskgate.brokers.sql.leases`); the WAL
    # writer flushes it within 3 x wal_writer_delay (200 ms by default).
    undo_window = 1.0

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.server = PostgresServer(settings=["max_connections=200"]).start()
        self.port = self.server.port

    def url(self, port: int | None = None) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{port or self.port}/postgres"

    def restart(self) -> None:
        self.server.crash()
        self.server.start()

    def stop(self) -> None:
        self.server.stop()


class MariaDBStore(Store):
    """A private MariaDB (``helpers.mariadb_servers.MariaDBServer``), database ``torture``."""

    name, has_server = "mysql", True

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.server = MariaDBServer(directory / "mariadb", options=["--max-connections=300"]).start()
        self.port = self.server.port
        connection = pymysql.connect(host="127.0.0.1", port=self.port, user="root")
        try:
            connection.cursor().execute("CREATE DATABASE torture")
        finally:
            connection.close()

    def url(self, port: int | None = None) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{port or self.port}/torture"

    def restart(self) -> None:
        self.server.crash()
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.directory / "mariadb", ignore_errors=True)


class RedisStore(Store):
    """A private Redis with an fsync-always append-only file, so a SIGKILL loses nothing
    acknowledged (``helpers.redis_servers.RedisServer``)."""

    name, has_server = "redis", True

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.server = RedisServer(directory / "redis", appendonly=True).start()
        self.port = self.server.port

    def url(self, port: int | None = None) -> str:
        return f"redis://127.0.0.1:{port or self.port}/0"

    def restart(self) -> None:
        self.server.kill()
        self.server.start()

    def stop(self) -> None:
        self.server.stop()


def open_store(backend: str, directory: Path) -> Store:
    """Start the store of ``backend`` (one of `BACKENDS`) with its files in ``directory``."""
    kinds: dict[str, type[Store]] = {
        "sqlite": Store,
        "postgresql": PostgresStore,
        "mysql": MariaDBStore,
        "redis": RedisStore,
    }
    if backend not in kinds:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)} or all")
    directory.mkdir(parents=True, exist_ok=True)
    return kinds[backend](directory)
