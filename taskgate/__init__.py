"""taskgate: queue tasks and run them under limits.

Per-queue concurrency, rate and burst; a hard periodic quota never over-issued across
processes; retries that tell a gateway's "busy" from a real failure; dependencies,
cancellation, graceful shutdown, and leases that bring crashed work back. One API over
memory, SQLite, PostgreSQL, MySQL/MariaDB and Redis.
"""

from __future__ import annotations

from taskgate.backoff import Backoff
from taskgate.brokers.base import UNSET
from taskgate.clock import Clock, ManualClock, SystemClock
from taskgate.config import Config, QueueConfig
from taskgate.errors import (
    AlreadyFinalError,
    AlreadyReplayedError,
    BrokerError,
    CompletedNotAllowedError,
    ConfigError,
    LeaseLostError,
    NoTaskError,
    QueueFullError,
    ReplayNotFinalError,
    ShutdownError,
    SkipRetry,
    TaskCanceledError,
    TaskExistsError,
    TaskFailedError,
    TaskgateError,
    TaskNotFoundError,
    Throttled,
    UnknownTypeError,
)
from taskgate.gate import Gate
from taskgate.retention import Retention
from taskgate.runtime import renew_lease, set_progress, step
from taskgate.schedules import Schedule
from taskgate.sync import SyncClient
from taskgate.task import Filter, QueueStats, Status, Task

__all__ = [
    "UNSET",
    "AlreadyFinalError",
    "AlreadyReplayedError",
    "Backoff",
    "BrokerError",
    "Clock",
    "CompletedNotAllowedError",
    "Config",
    "ConfigError",
    "Filter",
    "Gate",
    "LeaseLostError",
    "ManualClock",
    "NoTaskError",
    "QueueConfig",
    "QueueFullError",
    "QueueStats",
    "ReplayNotFinalError",
    "Retention",
    "Schedule",
    "ShutdownError",
    "SkipRetry",
    "Status",
    "SyncClient",
    "SystemClock",
    "Task",
    "TaskCanceledError",
    "TaskExistsError",
    "TaskFailedError",
    "TaskNotFoundError",
    "TaskgateError",
    "Throttled",
    "UnknownTypeError",
    "renew_lease",
    "set_progress",
    "step",
]

__version__ = "0.1.0.dev0"
