"""The five backends of the e2e tests, as plain data a child process can open too."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from taskgate import Gate
from taskgate.brokers.base import Broker

__all__ = ["BACKENDS", "CROSS_PROCESS_BACKENDS", "Backend", "GateFactory", "open_from_spec"]

BACKENDS = ["memory", "sqlite", "postgresql", "mariadb", "redis"]
# The memory broker lives in one process: no other process can share (or take back) its tasks.
CROSS_PROCESS_BACKENDS = [name for name in BACKENDS if name != "memory"]

# make_gate(**config) -> a Gate on a new broker of the chosen backend
GateFactory = Callable[..., Gate]


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


@dataclass
class Backend:
    """One isolated store of one backend, openable in this process or in a child process.

    ``spec`` is JSON-able data that `open_from_spec` (also used by the child worker script)
    turns into a broker on the same store.
    """

    name: str
    spec: dict[str, Any]
    opened: list[Broker] = field(default_factory=list)

    def open(self) -> Broker:
        """A NEW broker object (own connections) on this backend's store."""
        broker = open_from_spec(self.spec)
        self.opened.append(broker)
        return broker

    def close_all(self) -> None:
        """Close every broker `open` returned (closing is idempotent)."""
        for broker in self.opened:
            broker.close()
