"""Brokers: where tasks live. Backends are imported lazily so unused drivers need not be installed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from taskgate.brokers.base import (
    UNSET,
    Broker,
    Capabilities,
    FailureKind,
    Lease,
    NewTask,
    QuotaGrant,
    QuotaSpec,
)
from taskgate.brokers.params import (
    Canceled,
    Claim,
    Claimed,
    Complete,
    Fail,
    GiveBack,
    Heartbeat,
    Renewal,
    Replay,
    Requeue,
    Retry,
    Settle,
    SharedLimits,
    Submit,
    Submitted,
)

if TYPE_CHECKING:
    from taskgate.brokers.memory import MemoryBroker
    from taskgate.brokers.redis import RedisBroker
    from taskgate.brokers.sql import SQLBroker

__all__ = [
    "UNSET",
    "Broker",
    "Canceled",
    "Capabilities",
    "Claim",
    "Claimed",
    "Complete",
    "Fail",
    "FailureKind",
    "GiveBack",
    "Heartbeat",
    "Lease",
    "MemoryBroker",
    "NewTask",
    "QuotaGrant",
    "QuotaSpec",
    "RedisBroker",
    "Renewal",
    "Replay",
    "Requeue",
    "Retry",
    "SQLBroker",
    "Settle",
    "SharedLimits",
    "Submit",
    "Submitted",
    "open_broker",
]

_LAZY = {
    "MemoryBroker": "taskgate.brokers.memory",
    "SQLBroker": "taskgate.brokers.sql",
    "RedisBroker": "taskgate.brokers.redis",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'taskgate.brokers' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)


def open_broker(url: str, **options: Any) -> Broker:
    """Open the broker a URL names: ``memory://``, ``sqlite:///…``, ``postgresql[+psycopg]://…``,
    ``mysql[+pymysql]://…`` or ``redis://`` / ``rediss://``. Options go to the broker's constructor.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"open_broker needs a URL such as 'sqlite:///tasks.db', got {url!r}")
    scheme = url.split("://", 1)[0].lower()
    family = scheme.split("+", 1)[0]
    if family == "memory":
        from taskgate.brokers.memory import MemoryBroker

        return MemoryBroker(**options)
    if family in {"sqlite", "postgresql", "postgres", "mysql", "mariadb"}:
        from taskgate.brokers.sql import SQLBroker

        return SQLBroker(url, **options)
    if family in {"redis", "rediss", "unix"}:
        from taskgate.brokers.redis import RedisBroker

        return RedisBroker(url, **options)
    raise ValueError(
        f"open_broker: unknown scheme {scheme!r} in {url!r}; use memory, sqlite, postgresql, mysql or redis"
    )
