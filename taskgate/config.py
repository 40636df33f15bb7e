"""Configuration: `Config` for a gate, `QueueConfig` per queue, both validated on construction."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from taskgate.backoff import Backoff
from taskgate.brokers.base import MAX_DELAY
from taskgate.durations import DurationLike, parse_duration
from taskgate.errors import ConfigError
from taskgate.ids import MAX_ID_LENGTH
from taskgate.middleware import Middleware, check_middleware
from taskgate.retention import Retention
from taskgate.schedules import Schedule

if TYPE_CHECKING:
    from taskgate.brokers.base import Broker
    from taskgate.task import Task

__all__ = ["Config", "QueueConfig", "Retention", "Schedule", "StateChangeHook"]

StateChangeHook = Callable[["Task"], Any]

DEFAULT_LEASE_TTL = timedelta(seconds=60)
ON_FULL = ("block", "raise")  # what a submit to a queue at its max_pending does
MIN_QUOTA_PERIOD = timedelta(seconds=1)


def _rate_field(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{owner}.{name} must be a finite number, got {value!r}")
    if value < 0:
        raise ConfigError(f"{owner}.{name} must be >= 0, got {value!r}")


def _int_field(owner: str, name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{owner}.{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{owner}.{name} must be >= {minimum}, got {value!r}")
    return value


def _duration_field(owner: str, name: str, value: DurationLike) -> timedelta:
    try:
        return parse_duration(value, field=f"{owner}.{name}")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _name_field(owner: str, name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{owner}.{name} must be a non-empty string, got {value!r}")
    if len(value) > MAX_ID_LENGTH:
        raise ConfigError(f"{owner}.{name} is longer than {MAX_ID_LENGTH} characters: {value[:40]!r}…")
    return value


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """Limits of one queue, independent of every other queue.

    - ``workers``: handlers running at once (>= 1).
    - ``rps``/``burst``: handler starts per second (token bucket); ``rps=0`` means unlimited,
      ``burst=0`` means ``max(1, int(rps))``.
    - ``lease_ttl``: how long a claim holds without a heartbeat (default 60 s); heartbeats
      every ``lease_ttl/3`` unless ``manual_heartbeat``.
    - ``quota_limit``/``quota_period``/``quota_key``: at most ``quota_limit`` handler starts
      per epoch-aligned window of ``quota_period`` (>= 1 s), shared by queues with the same
      ``quota_key`` (default: the queue's name).
    - ``shared_limits``: ``workers`` and ``rps``/``burst`` count every process sharing the
      broker's store (True, the default, where the broker can count them: SQL and Redis);
      False counts them in each process apart (for a CPU-bound queue scaled out on purpose).
      The quota is always shared.
    - ``timeout``: how long one run of a handler may take (> 0; None: no limit); a run past it
      is cancelled and counts as a business failure (``TimeoutError``, retried as usual). A
      task submitted with a ``timeout`` of its own uses that instead.
    - ``group_workers``, ``group_rps``/``group_burst``, ``group_quota_limit``: the same limits
      for each group of the queue on its own (``submit(..., group=...)``; 0: no such limit;
      ``group_burst=0`` means ``max(1, int(group_rps))``; the group quota counts starts per
      window of ``quota_period``). A group at its limit never holds up another group's tasks;
      tasks without a group count against the queue's limits only. Counted in the store
      across processes: they need ``shared_limits`` and a broker that counts groups.
    - ``backoff``: the `Backoff` between business-failure retries of the queue's tasks whose
      handler sets none (None: the default, ``Backoff()``); from a mapping, its keys.
    - ``retention``: how long the queue's final tasks are kept (`Retention`); None: the
      `Config`'s.
    - ``max_pending``: back-pressure (0: none). A submit that would take the queue's pending
      + retrying + blocked tasks, counted in the store across processes, past it waits for
      room (``on_full="block"``, within the caller's cancel scope) or raises `QueueFullError`
      at once (``on_full="raise"``). A batch larger than ``max_pending`` can never fit: it
      raises at once either way, as `Gate.enqueue_in` does when the queue is full.
    """

    workers: int
    rps: float = 0
    burst: int = 0
    lease_ttl: DurationLike = DEFAULT_LEASE_TTL
    manual_heartbeat: bool = False
    quota_limit: int = 0
    quota_period: DurationLike | None = None
    quota_key: str | None = None
    shared_limits: bool = True
    timeout: DurationLike | None = None
    group_workers: int = 0
    group_rps: float = 0
    group_burst: int = 0
    group_quota_limit: int = 0
    backoff: Backoff | None = None
    retention: Retention | None = None
    max_pending: int = 0
    on_full: str = "block"

    def __post_init__(self) -> None:
        owner = "QueueConfig"
        _int_field(owner, "workers", self.workers, minimum=1)
        _rate_field(owner, "rps", self.rps)
        _int_field(owner, "burst", self.burst, minimum=0)
        ttl = _duration_field(owner, "lease_ttl", self.lease_ttl)
        if ttl <= timedelta(0):
            raise ConfigError(f"{owner}.lease_ttl must be > 0, got {self.lease_ttl!r}")
        object.__setattr__(self, "lease_ttl", ttl)
        for flag in ("manual_heartbeat", "shared_limits"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{owner}.{flag} must be a bool, got {getattr(self, flag)!r}")
        self._check_quota(owner)
        self._check_timeout(owner)
        self._check_groups(owner)
        self._check_backoff(owner)
        if isinstance(self.retention, dict):
            object.__setattr__(
                self, "retention", Retention.from_mapping(self.retention, where=f"{owner}.retention")
            )
        if self.retention is not None and not isinstance(self.retention, Retention):
            raise ConfigError(f"{owner}.retention must be a Retention or None, got {self.retention!r}")
        _int_field(owner, "max_pending", self.max_pending, minimum=0)
        if self.on_full not in ON_FULL:
            raise ConfigError(f"{owner}.on_full must be 'block' or 'raise', got {self.on_full!r}")

    def _check_quota(self, owner: str) -> None:
        _int_field(owner, "quota_limit", self.quota_limit, minimum=0)
        period = self.quota_period
        if period is not None:
            period = _duration_field(owner, "quota_period", period)
            object.__setattr__(self, "quota_period", period)
        if self.quota_key is not None:
            _name_field(owner, "quota_key", self.quota_key)
        if self.quota_limit == 0:
            return
        if period is None:
            raise ConfigError(f"{owner}.quota_limit={self.quota_limit} needs a quota_period")
        if period < MIN_QUOTA_PERIOD:
            raise ConfigError(f"{owner}.quota_period must be >= 1s, got {self.quota_period!r}")

    def _check_groups(self, owner: str) -> None:
        _int_field(owner, "group_workers", self.group_workers, minimum=0)
        _rate_field(owner, "group_rps", self.group_rps)
        _int_field(owner, "group_burst", self.group_burst, minimum=0)
        _int_field(owner, "group_quota_limit", self.group_quota_limit, minimum=0)
        if self.group_quota_limit and self.quota_period is None:
            raise ConfigError(f"{owner}.group_quota_limit={self.group_quota_limit} needs a quota_period")
        if self.has_group_limits and not self.shared_limits:
            raise ConfigError(
                f"{owner}: group limits are counted in the store across processes: they need "
                "shared_limits=True"
            )

    def _check_backoff(self, owner: str) -> None:
        value: object = self.backoff
        if isinstance(value, Mapping):  # Config.from_mapping: a YAML mapping of Backoff's keys
            try:
                value = Backoff(**value)
            except TypeError as exc:
                raise ConfigError(f"{owner}.backoff: {exc}") from None
            object.__setattr__(self, "backoff", value)
        if value is not None and not isinstance(value, Backoff):
            raise ConfigError(f"{owner}.backoff must be a taskgate.Backoff or None, got {value!r}")

    def _check_timeout(self, owner: str) -> None:
        if self.timeout is None:
            return
        limit = _duration_field(owner, "timeout", self.timeout)
        if not timedelta(0) < limit <= MAX_DELAY:
            raise ConfigError(
                f"{owner}.timeout must be > 0 and at most {MAX_DELAY.days} days, got {self.timeout!r}"
            )
        object.__setattr__(self, "timeout", limit)

    @property
    def lease(self) -> timedelta:
        """``lease_ttl`` as a timedelta."""
        assert isinstance(self.lease_ttl, timedelta)
        return self.lease_ttl

    @property
    def period(self) -> timedelta | None:
        """``quota_period`` as a timedelta, or None."""
        assert self.quota_period is None or isinstance(self.quota_period, timedelta)
        return self.quota_period

    @property
    def run_limit(self) -> timedelta | None:
        """``timeout`` as a timedelta, or None (no limit)."""
        assert self.timeout is None or isinstance(self.timeout, timedelta)
        return self.timeout

    @property
    def effective_burst(self) -> int:
        """The bucket size: ``burst``, or ``max(1, int(rps))`` when burst is 0."""
        return self.burst or max(1, int(self.rps))

    @property
    def has_group_limits(self) -> bool:
        """True when a group limit is set."""
        return bool(self.group_workers or self.group_rps or self.group_quota_limit)

    @property
    def effective_group_burst(self) -> int:
        """A group's bucket size: ``group_burst``, or ``max(1, int(group_rps))`` when it is 0."""
        return self.group_burst or max(1, int(self.group_rps))

    @property
    def has_quota(self) -> bool:
        """True when a periodic quota applies."""
        return self.quota_limit > 0

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str = "queue") -> QueueConfig:
        """Build from a mapping with the keys of the YAML example; unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}: {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {sorted(known)}")
        if "workers" not in data:
            raise ConfigError(f"{where}: 'workers' is required")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Config:
    """Everything a `Gate` needs; validated on construction (broker-dependent checks in `Gate`).

    A task type goes to ``routes[type]``, else to the queue named like the type. A queue not in
    ``queues`` takes ``default_queue``'s limits; without ``default_queue`` it is an error.
    ``max_retry`` is the default per-task retry budget for business failures. ``retention``:
    how long final tasks are kept (`Retention`: completed and canceled 7 days, failed 30),
    unless their queue's `QueueConfig` says otherwise; the reaper of a running gate deletes
    older ones. ``middleware``: coroutines ``async def mw(task, call_next)`` wrapped around
    every handler run, the first outermost (`taskgate.middleware`); one that is not a
    coroutine function raises `ConfigError` naming it. ``schedules``: `Schedule`s every running
    gate of this config ticks (`Gate.schedule`); a duplicate name, a type without a queue or
    submit options a task could not take raise `ConfigError` naming the schedule.
    """

    broker: Broker
    queues: Mapping[str, QueueConfig] = field(default_factory=dict)
    routes: Mapping[str, str] = field(default_factory=dict)
    default_queue: QueueConfig | None = None
    max_retry: int = 0
    lease_lost_max: int = 3
    throttled_max: int = 100
    on_state_change: StateChangeHook | None = None
    retention: Retention = field(default_factory=Retention)
    middleware: Sequence[Middleware] = ()
    schedules: Sequence[Schedule] = ()

    def __post_init__(self) -> None:
        if self.broker is None:
            raise ConfigError("Config.broker is required (e.g. MemoryBroker() or SQLBroker(url))")
        if not isinstance(self.queues, Mapping):
            raise ConfigError(f"Config.queues must be a mapping, got {self.queues!r}")
        for name, queue in self.queues.items():
            _name_field("Config", "queues key", name)
            if not isinstance(queue, QueueConfig):
                raise ConfigError(f"Config.queues[{name!r}] must be a QueueConfig, got {queue!r}")
        if self.default_queue is not None and not isinstance(self.default_queue, QueueConfig):
            raise ConfigError(f"Config.default_queue must be a QueueConfig, got {self.default_queue!r}")
        self._check_routes()
        _int_field("Config", "max_retry", self.max_retry, minimum=0)
        _int_field("Config", "lease_lost_max", self.lease_lost_max, minimum=1)
        _int_field("Config", "throttled_max", self.throttled_max, minimum=1)
        if self.on_state_change is not None and not callable(self.on_state_change):
            raise ConfigError(f"Config.on_state_change must be callable, got {self.on_state_change!r}")
        self._check_shared_quota_keys()
        if isinstance(self.retention, dict):
            object.__setattr__(
                self, "retention", Retention.from_mapping(self.retention, where="Config.retention")
            )
        if not isinstance(self.retention, Retention):
            raise ConfigError(f"Config.retention must be a Retention, got {self.retention!r}")
        object.__setattr__(self, "middleware", check_middleware(self.middleware))
        self._check_schedules()

    def _check_schedules(self) -> None:
        # Imported here: checking a schedule builds a task, and that module needs this one.
        from taskgate.runtime.submission import check_schedule

        if isinstance(self.schedules, str | bytes) or not isinstance(self.schedules, Sequence):
            raise ConfigError(f"Config.schedules must be a sequence of Schedule, got {self.schedules!r}")
        names: set[str] = set()
        for schedule in self.schedules:
            if not isinstance(schedule, Schedule):
                raise ConfigError(f"Config.schedules holds {schedule!r}, not a taskgate.Schedule")
            if schedule.name in names:
                raise ConfigError(f"Config.schedules names schedule {schedule.name!r} twice")
            names.add(schedule.name)
            check_schedule(self, schedule)
        object.__setattr__(self, "schedules", tuple(self.schedules))

    def _check_routes(self) -> None:
        if not isinstance(self.routes, Mapping):
            raise ConfigError(f"Config.routes must be a mapping, got {self.routes!r}")
        for task_type, queue in self.routes.items():
            _name_field("Config", "routes key", task_type)
            _name_field("Config", f"routes[{task_type!r}]", queue)
            if queue not in self.queues and self.default_queue is None:
                raise ConfigError(
                    f"Config.routes[{task_type!r}] = {queue!r}: no such queue in Config.queues "
                    "and no default_queue"
                )

    def _check_shared_quota_keys(self) -> None:
        seen: dict[str, tuple[str, int, timedelta | None]] = {}
        for name, queue in self.queues.items():
            if not queue.has_quota:
                continue
            key = queue.quota_key or name
            budget = (name, queue.quota_limit, queue.period)
            first = seen.setdefault(key, budget)
            if first[1:] != budget[1:]:
                raise ConfigError(
                    f"queues {first[0]!r} and {name!r} share quota_key {key!r} with different "
                    f"limits ({first[1]}/{first[2]} vs {budget[1]}/{budget[2]})"
                )

    def queue_for(self, task_type: str) -> str:
        """The queue a task type runs in: its route, else the queue named like the type."""
        return self.routes.get(task_type, task_type)

    def queue_config(self, queue: str) -> QueueConfig | None:
        """The limits of ``queue``: its own entry, else ``default_queue``, else None."""
        return self.queues.get(queue, self.default_queue)

    def quota_key(self, queue: str) -> str | None:
        """The quota budget ``queue`` draws from, or None when it has no quota."""
        conf = self.queue_config(queue)
        if conf is None or not conf.has_quota:
            return None
        return conf.quota_key or queue

    @classmethod
    def from_mapping(
        cls,
        data: Mapping[str, Any],
        *,
        broker: Broker,
        on_state_change: StateChangeHook | None = None,
    ) -> Config:
        """Build from a dict shaped like the YAML example (``queues``, ``routes``, ...).

        The library reads no file: an app loads its own (e.g. ``yaml.safe_load``) and passes
        the result. Unknown keys raise `ConfigError`.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"config must be a mapping, got {type(data).__name__}: {data!r}")
        known = {
            "queues",
            "routes",
            "default_queue",
            "max_retry",
            "lease_lost_max",
            "throttled_max",
            "retention",
            "schedules",
        }
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise ConfigError(f"config: unknown key(s) {', '.join(unknown)}; known: {sorted(known)}")
        raw_queues = data.get("queues") or {}
        if not isinstance(raw_queues, Mapping):
            raise ConfigError(f"config.queues must be a mapping, got {raw_queues!r}")
        queues = {
            name: QueueConfig.from_mapping(body, where=f"queues.{name}") for name, body in raw_queues.items()
        }
        raw_default = data.get("default_queue")
        default = (
            None if raw_default is None else QueueConfig.from_mapping(raw_default, where="default_queue")
        )
        routes = data.get("routes") or {}
        if not isinstance(routes, Mapping):
            raise ConfigError(f"config.routes must be a mapping, got {routes!r}")
        options = {
            k: data[k] for k in ("max_retry", "lease_lost_max", "throttled_max", "retention") if k in data
        }
        raw_schedules = data.get("schedules") or []
        if not isinstance(raw_schedules, list):
            raise ConfigError(f"config.schedules must be a list of mappings, got {raw_schedules!r}")
        schedules = [
            Schedule.from_mapping(body, where=f"schedules[{i}]") for i, body in enumerate(raw_schedules)
        ]
        return cls(
            broker=broker,
            queues=queues,
            routes=dict(routes),
            default_queue=default,
            on_state_change=on_state_change,
            schedules=schedules,
            **options,
        )
