"""Fixtures of the end-to-end tests: the mock gateway, and ONE fixture choosing the backend.

The e2e layer runs on asyncio only: the anyio/Trio matrix is covered by the integration
tests, and here the five backends already multiply every scenario; one event loop keeps the
directory well under two minutes.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskgate import Config, Gate

from .backends import BACKENDS, Backend, GateFactory
from .gateway import Gateway


@pytest.fixture
def anyio_backend() -> str:
    """Pin the e2e scenarios to asyncio (see the module docstring)."""
    return "asyncio"


def _delete_redis_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The store a scenario runs on: memory, a SQLite file, a fresh PostgreSQL or MariaDB
    database, or Redis under a random key prefix (its keys deleted afterwards)."""
    name = request.param
    cleanup: Callable[[], None] | None = None
    if name == "memory":
        spec: dict[str, Any] = {"kind": "memory"}
    elif name == "sqlite":
        spec = {"kind": "sql", "url": f"sqlite:///{tmp_path / 'tasks.db'}"}
    elif name == "postgresql":
        spec = {"kind": "sql", "url": request.getfixturevalue("postgresql_url")}
    elif name == "mariadb":
        spec = {"kind": "sql", "url": request.getfixturevalue("mysql_url")}
    else:
        url = request.getfixturevalue("redis_url")
        prefix = f"tge2e_{secrets.token_hex(4)}:"
        spec = {"kind": "redis", "url": url, "key_prefix": prefix}
        cleanup = functools.partial(_delete_redis_keys, url, prefix)
    store = Backend(name, spec)
    try:
        yield store
    finally:
        store.close_all()
        if cleanup is not None:
            cleanup()


@pytest.fixture
def make_gate(backend: Backend) -> GateFactory:
    """Build a `Gate` on a new broker of the chosen backend: ``make_gate(queues=..., ...)``."""

    def build(**config: Any) -> Gate:
        return Gate(Config(broker=backend.open(), **config))

    return build


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    """A well-behaved mock gateway; each scenario turns on the misbehaviour it needs."""
    with Gateway() as gw:
        yield gw


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep ``real_gateway`` tests out of every run that does not select them with ``-m``."""
    if "real_gateway" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="talks to a real gateway; run with -m real_gateway")
    for item in items:
        if item.get_closest_marker("real_gateway"):
            item.add_marker(skip)
