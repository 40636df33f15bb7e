"""Where a command's gate comes from: a client-only gate over the store a URL names, or the
application's own gate imported from ``MODULE:GATE``.

A client-only gate registers no handlers, so it never claims; its ``default_queue`` accepts
any queue name, so `stats`, `pause` and `resume` work on queues the CLI has no config for (the
limits it reports are then unknown; `--app` reads them from the application's config).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from taskgate.brokers import open_broker
from taskgate.brokers.base import Broker
from taskgate.cli.errors import CLIError
from taskgate.config import Config, QueueConfig
from taskgate.gate import Gate

__all__ = ["client_gate", "load_gate", "open_store", "store_family"]

_SQL = {"sqlite", "postgresql", "postgres", "mysql", "mariadb"}
_REDIS = {"redis", "rediss", "unix"}


def store_family(url: str) -> str:
    """``sql``, ``redis`` or ``memory`` for a store URL; `CLIError` for anything else."""
    if "://" not in url:
        raise CLIError(f"--url must be a URL such as sqlite:///tasks.db or redis://host, got {url!r}")
    family = url.split("://", 1)[0].lower().split("+", 1)[0]
    if family in _SQL:
        return "sql"
    if family in _REDIS:
        return "redis"
    if family == "memory":
        raise CLIError("--url memory:// names a store of one process; the CLI needs a shared one")
    raise CLIError(f"unknown store scheme {family!r} in --url; use sqlite, postgresql, mysql or redis")


def open_store(url: str | None, prefix: str | None) -> Broker:
    """The broker ``url`` names, with ``prefix`` as its table or key prefix (None: the default).

    SQL tables are never created here: an operator's command on a database without them says
    which migration to run instead.
    """
    if not url:
        raise CLIError("no store: pass --url or set TASKGATE_URL (e.g. postgresql://user@host/db)")
    options: dict[str, Any] = {}
    if store_family(url) == "sql":
        options["create_tables"] = False
        if prefix:
            options["table_prefix"] = prefix
    elif prefix:
        options["key_prefix"] = prefix
    return open_broker(url, **options)


def client_gate(broker: Broker) -> Gate:
    """A gate over ``broker`` that claims nothing and knows every queue by a default config."""
    return Gate(Config(broker=broker, default_queue=QueueConfig(workers=1)))


def load_gate(spec: str) -> Gate:
    """The `Gate` at ``MODULE:ATTRIBUTE`` (a gate, or a function of no arguments returning one),
    imported with the current directory on ``sys.path`` as ``python -m`` would have it."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CLIError(f"expected MODULE:GATE such as myapp.tasks:gate, got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise CLIError(f"cannot import {module_name!r}: no module named {exc.name!r}") from None
        raise
    found: object = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise CLIError(f"module {module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not isinstance(found, Gate) and callable(found):
        found = found()
    if not isinstance(found, Gate):
        raise CLIError(f"{spec} is a {type(found).__name__}, not a taskgate.Gate")
    return found
