"""Fixtures of the runtime tests.

The broker under test is chosen by ONE fixture, `gate_broker`: memory always, SQLite when
`taskgate.brokers.sql` provides `SQLBroker`. Every broker gets the test's `ManualClock`, so
broker time (run_at, leases, quota windows) only moves when a test advances it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sql_sessions import Server, server_for

from taskgate import ManualClock
from taskgate.brokers.base import Broker
from taskgate.brokers.memory import MemoryBroker


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
    import redis

    plain = redis.Redis.from_url(redis_url)
    yield plain
    plain.close()


@pytest.fixture(params=["postgresql", "mysql", "sqlite"])
def sql_server(request: pytest.FixtureRequest, tmp_path: Path) -> Server:
    """Each SQL backend's `Server` (sessions listed and ended); SQLite's a file with no server."""
    return server_for(request, tmp_path)


@pytest.fixture(params=["postgresql", "mysql"])
def networked_sql(request: pytest.FixtureRequest, tmp_path: Path) -> Server:
    """`sql_server` for the backends with a server: PostgreSQL and MySQL."""
    return server_for(request, tmp_path)
