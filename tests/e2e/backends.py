"""Opening a broker from plain data, so a child process can join the test's store."""

from __future__ import annotations

from typing import Any

from taskgate.brokers.base import Broker

__all__ = ["open_from_spec"]


def open_from_spec(spec: dict[str, Any]) -> Broker:
    """Open a broker described by ``spec``: ``{"kind": "memory"}``, ``{"kind": "sql", "url": …}``
    or ``{"kind": "redis", "url": …, "key_prefix": …}``."""
    kind = spec["kind"]
    if kind == "memory":
        from taskgate.brokers import MemoryBroker

        return MemoryBroker()
    if kind == "sql":
        from taskgate.brokers import SQLBroker

        return SQLBroker(spec["url"])
    if kind == "redis":
        from taskgate.brokers import RedisBroker

        return RedisBroker(spec["url"], key_prefix=spec["key_prefix"])
    raise ValueError(f"unknown backend kind {kind!r}")
