"""Fixtures of the runtime tests.

The broker under test is chosen by ONE fixture, `gate_broker`: memory always, SQLite when
`taskgate.brokers.sql` provides `SQLBroker`; tests that must hold on every backend take `broker`
(each of the five, by `backend`). Every broker gets the test's `ManualClock`, so broker time
(run_at, leases, quota windows) only moves when a test advances it.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers.redis_servers import RedisServer, have_redis_server, purge_prefix
from sql_sessions import Server, server_for

from taskgate import ManualClock
from taskgate.brokers.base import Broker
from taskgate.brokers.memory import MemoryBroker
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.sql import SQLBroker  # type: ignore[attr-defined]


def _sql_available() -> bool:
    try:
        return hasattr(importlib.import_module("taskgate.brokers.sql"), "SQLBroker")
    except ImportError:
        return False


GATE_BROKERS = [
    "memory",
    pytest.param("sqlite", marks=pytest.mark.skipif(not _sql_available(), reason="SQLBroker not available")),
]


@pytest.fixture
def clock() -> ManualClock:
    """The broker's clock; tests move it instead of sleeping."""
    return ManualClock()


@pytest.fixture(params=GATE_BROKERS)
def gate_broker(request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Any) -> Iterator[Broker]:
    """The broker every runtime test runs on (swap the params to run them elsewhere)."""
    if request.param == "memory":
        broker: Broker = MemoryBroker(clock=clock)
    else:
        from taskgate.brokers.sql import SQLBroker  # type: ignore[attr-defined]

        broker = SQLBroker(f"sqlite:///{tmp_path / 'gate.db'}", clock=clock)
    yield broker
    broker.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    """A plain redis-py client on the shared Redis, to look at what a broker stored."""

    plain = redis.Redis.from_url(redis_url)
    yield plain
    plain.close()


EVERY_BACKEND = ["memory", "sqlite", "postgresql", "mysql", "redis"]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, for what must not touch the tests running beside it
    on the shared one: killing every connection, counting them, deleting the function library."""
    if not have_redis_server():
        message = "redis-server not installed: cannot start a private server"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture(params=EVERY_BACKEND)
def backend(request: pytest.FixtureRequest) -> str:
    """Each of the five backends (tests may narrow it with ``indirect`` parametrisation)."""
    return str(request.param)


@pytest.fixture
def broker(
    backend: str, request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path
) -> Iterator[Broker]:
    """A broker of ``backend`` on the test's clock (fresh database / key prefix per test)."""
    opened: Broker
    if backend == "memory":
        opened = MemoryBroker(clock=clock)
    elif backend == "sqlite":
        opened = SQLBroker(f"sqlite:///{tmp_path / 'gate.db'}", clock=clock)
    elif backend == "redis":
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("unique_prefix")
        opened = RedisBroker(url, key_prefix=prefix, clock=clock)

        request.addfinalizer(functools.partial(purge_prefix, url, prefix))
    else:
        opened = SQLBroker(request.getfixturevalue(f"{backend}_url"), clock=clock)
    yield opened
    opened.close()


@pytest.fixture(params=["postgresql", "mysql", "sqlite"])
def sql_server(request: pytest.FixtureRequest, tmp_path: Path) -> Server:
    """Each SQL backend's `Server` (sessions listed and ended); SQLite's a file with no server."""
    return server_for(request, tmp_path)


@pytest.fixture(params=["postgresql", "mysql"])
def networked_sql(request: pytest.FixtureRequest, tmp_path: Path) -> Server:
    """`sql_server` for the backends with a server: PostgreSQL and MySQL."""
    return server_for(request, tmp_path)


@pytest.fixture(params=["sqlite", "postgresql", "mysql", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(url, broker options)`` of a store that several worker processes of a test open: a
    SQLite file, a fresh PostgreSQL or MariaDB database, or a Redis key prefix (purged after)."""
    backend = str(request.param)
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}", {}
    elif backend == "redis":
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("unique_prefix")
        yield url, {"key_prefix": prefix}
        purge_prefix(url, prefix)
    else:
        yield request.getfixturevalue(f"{backend}_url"), {}
