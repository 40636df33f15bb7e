"""Turning `Gate.submit` arguments into validated `NewTask`s, before anything is stored."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from taskgate.brokers.base import MAX_DELAY, NewTask, check_identifier, check_priority
from taskgate.clock import utc
from taskgate.codec import encode_value
from taskgate.config import Config
from taskgate.durations import DurationLike, parse_duration
from taskgate.errors import ConfigError
from taskgate.ids import new_ids
from taskgate.schedules import Schedule

__all__ = ["build_tasks", "check_schedule", "pause_for", "route", "run_timeout"]


def route(config: Config, task_type: str) -> str:
    """The queue of ``task_type``; `ConfigError` when that queue has no limits configured."""
    check_identifier(task_type, what="task type")
    queue = config.queue_for(task_type)
    if config.queue_config(queue) is None:
        raise ConfigError(
            f"task type {task_type!r} goes to queue {queue!r}, which is not in Config.queues, "
            "and there is no default_queue"
        )
    return queue


def _duration(value: DurationLike | None, name: str, example: str) -> timedelta | None:
    """A duration argument parsed (None stays None), or `TypeError` naming ``name``."""
    if value is None:
        return None
    if not isinstance(value, timedelta | int | float | str) or isinstance(value, bool):
        raise TypeError(f"{name} must be a timedelta, seconds or a string like '{example}', got {value!r}")
    return parse_duration(value, field=name)


def _delay(delay: DurationLike | None) -> timedelta | None:
    value = _duration(delay, "delay", "10s")
    if value is not None and value < timedelta(0):
        raise ValueError(f"delay must be >= 0, got {delay!r}")
    return value


def run_timeout(timeout: DurationLike | None) -> timedelta | None:
    """A run limit given like ``delay`` (None: none): > 0, at most `MAX_DELAY`; `TypeError`/
    `ValueError` naming a bad one."""
    value = _duration(timeout, "timeout", "30s")
    if value is not None and not timedelta(0) < value <= MAX_DELAY:
        raise ValueError(f"timeout must be > 0 and at most {MAX_DELAY.days} days, got {timeout!r}")
    return value


def pause_for(for_: DurationLike | None) -> timedelta | None:
    """`Gate.pause`'s ``for_`` read like ``delay`` (None: until resumed): > 0, at most
    `MAX_DELAY`; else `TypeError`/`ValueError` naming it."""
    value = _duration(for_, "for_", "10m")
    if value is not None and not timedelta(0) < value <= MAX_DELAY:
        raise ValueError(f"for_ must be > 0 and at most {MAX_DELAY.days} days, got {for_!r}")
    return value


def _run_at(run_at: datetime | None) -> datetime | None:
    if run_at is None:
        return None
    if not isinstance(run_at, datetime):
        raise TypeError(f"run_at must be a datetime, got {type(run_at).__name__}: {run_at!r}")
    if run_at.tzinfo is None:
        raise ValueError(f"run_at must be timezone-aware (e.g. UTC), got naive {run_at!r}")
    return utc(run_at)


def _max_retry(config: Config, max_retry: int | None) -> int:
    if max_retry is None:
        return config.max_retry
    if isinstance(max_retry, bool) or not isinstance(max_retry, int):
        raise TypeError(f"max_retry must be an int, got {max_retry!r}")
    if max_retry < 0:
        raise ValueError(f"max_retry must be >= 0, got {max_retry}")
    return max_retry


def _parents(depends_on: Iterable[str]) -> tuple[str, ...]:
    if isinstance(depends_on, str | bytes):
        raise TypeError("depends_on must be a sequence of execution ids, not a single string")
    try:
        parents = tuple(depends_on)
    except TypeError:
        raise TypeError(f"depends_on must be a sequence of execution ids, got {depends_on!r}") from None
    for parent in parents:
        check_identifier(parent, what="depends_on id")
    return parents


def _keys(business_keys: Iterable[str | None] | None, count: int) -> Sequence[str | None]:
    """One business key (or None) per payload; a key given twice or a count mismatch is refused."""
    if business_keys is None:
        return [None] * count
    if isinstance(business_keys, str | bytes):
        raise TypeError("business_keys must be a sequence of keys (one per payload), not a single string")
    keys = list(business_keys)
    if len(keys) != count:
        raise ValueError(f"business_keys has {len(keys)} keys for {count} payloads; give one per payload")
    seen: set[str] = set()
    for n, key in enumerate(keys):
        if key is None:
            continue
        check_identifier(key, what=f"business_keys[{n}]")
        if key in seen:
            raise ValueError(f"business_keys[{n}] = {key!r} appears twice; a key names one execution")
        seen.add(key)
    return keys


def build_tasks(
    config: Config,
    task_type: str,
    payloads: Iterable[Any],
    *,
    business_key: str | None = None,
    business_keys: Iterable[str | None] | None = None,
    delay: DurationLike | None = None,
    run_at: datetime | None = None,
    max_retry: int | None = None,
    depends_on: Iterable[str] = (),
    ignore_parent_failure: bool = False,
    timeout: DurationLike | None = None,
    group: str | None = None,
    trace_context: str | None = None,
    priority: int = 0,
) -> list[NewTask]:
    """One `NewTask` per payload; raises `TypeError`/`ValueError`/`ConfigError` naming the argument.

    ``run_at`` wins over ``delay``; ``timeout`` (None: the queue's) is each task's own;
    ``group``, ``priority`` and ``trace_context`` (the submit's span, `taskgate.runtime.tracing`)
    are every task's.
    ``business_key`` names the one task of a single submit; ``business_keys`` gives one key
    (or None) per payload. Nothing is stored here, so bad input changes nothing.
    """
    queue = route(config, task_type)
    if business_key is not None:
        check_identifier(business_key, what="business_key")
    if group is not None:
        check_identifier(group, what="group")
    check_priority(priority)
    items = list(payloads)
    keys = _keys(business_keys, len(items)) if business_key is None else [business_key] * len(items)
    if not isinstance(ignore_parent_failure, bool):
        raise TypeError(f"ignore_parent_failure must be a bool, got {ignore_parent_failure!r}")
    when = _run_at(run_at)
    wait = _delay(delay)
    if when is not None:
        wait = None
    retries = _max_retry(config, max_retry)
    limit = run_timeout(timeout)
    parents = _parents(depends_on)
    ids = new_ids(len(items))
    encoded = [encode_value(payload, what="payload") for payload in items]
    if not items:
        return []
    # The first task goes through NewTask's own checks, which cover every field the batch
    # shares; the rest differ only in values already checked here (fresh ids, encoded
    # payloads, checked keys), so they are copies of it with those three fields replaced.
    first = NewTask(
        id=ids[0],
        type=task_type,
        queue=queue,
        payload=encoded[0],
        max_retry=retries,
        run_at=when,
        delay=wait,
        depends_on=parents,
        ignore_parent_failure=ignore_parent_failure,
        business_key=keys[0],
        timeout=limit,
        group=group,
        trace_context=trace_context,
        priority=priority,
    )
    if len(items) == 1:
        return [first]
    return [first, *map(_like(first), ids[1:], encoded[1:], keys[1:])]


_SLOTS = tuple((name, getattr(NewTask, name).__set__) for name in NewTask.__slots__)
_VARYING = frozenset({"id", "payload", "business_key"})


def _like(template: NewTask) -> Callable[[str, bytes | None, str | None], NewTask]:
    """A maker of copies of ``template`` with another id, payload and business key (unchecked).

    Setting the slots directly costs a fraction of the frozen dataclass's ``__init__`` and
    ``__post_init__``, which matter at tens of thousands of tasks per second.
    """
    shared = [(setter, getattr(template, name)) for name, setter in _SLOTS if name not in _VARYING]
    setters = dict(_SLOTS)
    set_id, set_payload, set_key = setters["id"], setters["payload"], setters["business_key"]
    new = object.__new__

    def make(task_id: str, payload: bytes | None, key: str | None) -> NewTask:
        task = new(NewTask)
        for setter, value in shared:
            setter(task, value)
        set_id(task, task_id)
        set_payload(task, payload)
        set_key(task, key)
        return task

    return make


def check_schedule(config: Config, schedule: Schedule) -> None:
    """`ConfigError` naming ``schedule`` when its type has no queue under ``config`` or its
    payload or submit options would not make a task (built once, as a tick would, and dropped)."""
    try:
        route(config, schedule.type)
    except ConfigError as exc:
        raise ConfigError(f"schedule {schedule.name!r}: {exc}") from None
    unknown = sorted(set(schedule.submit_options) - _schedule_options())
    if unknown:
        raise ConfigError(
            f"schedule {schedule.name!r}: unknown submit option(s) {', '.join(unknown)}; known: "
            f"{sorted(_schedule_options())}"
        )
    tick = datetime(2000, 1, 1, tzinfo=UTC)
    try:
        build_tasks(
            config,
            schedule.type,
            [schedule.payload],
            business_key=schedule.key(tick),
            run_at=tick,
            **schedule.submit_options,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"schedule {schedule.name!r}: {exc}") from None


def _schedule_options() -> set[str]:
    """The keywords of `build_tasks` a schedule passes on as they are (the rest it sets)."""
    own = {"config", "task_type", "payloads", "business_key", "business_keys", "run_at", "delay"}
    return set(inspect.signature(build_tasks).parameters) - own - {"trace_context"}
