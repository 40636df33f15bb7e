"""Cron schedules: `Schedule` (what to submit, when) and `Cron` (the tick instants of one).

The cron expressions are parsed and evaluated by ``cronsim`` (the parser of Healthchecks):
pure Python with no dependencies of its own, typed, able to walk backwards as well as
forwards (what the catch-up walk needs), and precise about daylight saving time. ``croniter``
was the other candidate; it pulls in ``python-dateutil`` and its DST handling has a long
record of corner-case bugs. A 6-field expression has a leading seconds field
(``"*/10 * * * * *"``: every ten seconds); 5 fields are the usual minute-first cron.

Daylight saving time follows cronsim, which follows Debian's cron:

- An expression with a fixed minute and hour (``"30 2 * * *"``, 5 fields) names a wall-clock
  time of ``timezone``. On a spring-forward day that time does not exist, and the tick comes
  at the first wall-clock time after the gap (02:30 in Europe/Berlin on 2026-03-29 ticks at
  03:00 CEST, 01:00 UTC). On a fall-back day it occurs twice and the tick comes once, at the
  first occurrence (02:30 CEST, 00:30 UTC on 2026-10-25).
- Any other expression (a ``*`` or ``*/n`` in the minute or hour field, or 6 fields) ticks
  in elapsed time: an hourly ``"0 * * * *"`` ticks every real hour, so on a fall-back day
  02:00 comes twice (00:00 and 01:00 UTC) and on a spring-forward day 02:00 not at all.

Every tick is an instant; this module gives them in UTC. `Cron.after` is the canonical
forward sequence; `Cron.at_or_before` and `Cron.before` walk back and then step forward along
that sequence, so that walking back from inside a repeated hour finds the same ticks that
walking forward did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from taskgate.errors import ConfigError
from taskgate.ids import MAX_ID_LENGTH

__all__ = ["KEY_PREFIX", "Cron", "Schedule", "tick_key"]

KEY_PREFIX = "schedule"
# The tick part of a key: an ISO-8601 UTC instant to the second, "2026-03-29T01:00:00+00:00".
_TICK_TEXT = len("2026-03-29T01:00:00+00:00")
# The longest schedule name whose keys fit an indexed business key.
_MAX_NAME = MAX_ID_LENGTH - len(KEY_PREFIX) - 2 - _TICK_TEXT
# Options a schedule sets itself, so it takes none of them from the caller.
_SET_BY_SCHEDULE = ("business_key", "business_keys", "run_at", "delay")
_SECOND = timedelta(seconds=1)
# cronsim may answer a tick not after the start once inside a repeated hour (see the module
# docstring); a few more steps always get past it.
_MAX_STEPS = 8


def tick_key(name: str, tick: datetime) -> str:
    """The business key of schedule ``name``'s task for ``tick``: ``schedule:<name>:<UTC ISO>``."""
    return f"{KEY_PREFIX}:{name}:{tick.astimezone(UTC).isoformat()}"


class Cron:
    """The ticks of a cron expression in a time zone, as aware UTC datetimes (whole seconds).

    Raises `ConfigError` naming a bad ``expression`` or an unknown ``timezone``.
    """

    def __init__(self, expression: str, timezone: str = "UTC") -> None:
        if not isinstance(expression, str):
            raise ConfigError(f"cron expression must be a str, got {expression!r}")
        self.zone = _zone(timezone)
        self.expression = expression
        try:
            CronSim(expression, datetime.now(self.zone))
        except CronSimError as exc:
            raise ConfigError(f"invalid cron expression {expression!r}: {exc}") from None

    def after(self, t: datetime) -> datetime | None:
        """The first tick later than ``t``; None when there is none within cronsim's 50 years."""
        walk = CronSim(self.expression, t.astimezone(self.zone))
        for _ in range(_MAX_STEPS):
            found = _step(walk)
            if found is None or found > t:
                return found
        return None

    def at_or_before(self, t: datetime) -> datetime | None:
        """The latest tick at or before ``t``; None when there is none."""
        return self._back_then_forward(t.replace(microsecond=0) + _SECOND, t, inclusive=True)

    def before(self, t: datetime) -> datetime | None:
        """The latest tick earlier than ``t``; None when there is none."""
        return self._back_then_forward(t, t, inclusive=False)

    def _back_then_forward(self, start: datetime, t: datetime, *, inclusive: bool) -> datetime | None:
        walk = CronSim(self.expression, start.astimezone(self.zone), reverse=True)
        found = _step(walk)
        for _ in range(_MAX_STEPS):
            if found is None or found < t or (inclusive and found == t):
                break
            found = _step(walk)
        if found is None:
            return None
        # Step forward along the canonical sequence: a reverse walk from inside a repeated hour
        # starts from the wall-clock time and may land a tick too early.
        while True:
            later = self.after(found)
            if later is None or later > t or (not inclusive and later == t):
                return found
            found = later


def _step(walk: CronSim) -> datetime | None:
    try:
        return next(walk).astimezone(UTC)
    except StopIteration:
        return None


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"timezone must be an IANA time zone name like 'Europe/Berlin', got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"unknown time zone {name!r} (an IANA name like 'Europe/Berlin')") from None


@dataclass(frozen=True, init=False, eq=True)
class Schedule:
    """Submit a task of ``type`` with ``payload`` at every tick of the cron expression ``cron``.

    ``cron``: 5 fields (minute first) or 6 (a leading seconds field), read in ``timezone``
    (an IANA name; DST as in `taskgate.schedules`). Each tick's task has the business key
    ``schedule:<name>:<tick as UTC ISO-8601>`` and ``run_at`` the tick, so one task per tick
    exists however many gates tick the schedule. ``catch_up``: after downtime, submit every
    missed tick (oldest first) instead of only the latest. ``submit_options`` are `Gate.submit`'s
    (``max_retry``, ``timeout``, ``group``, ...) except ``business_key``, ``run_at`` and
    ``delay``, which the schedule sets.

    Raises `ConfigError` naming a bad name, expression, time zone or option; what depends on the
    `Config` (the type's route, the options' values) is checked by `Config` and
    `Gate.schedule`.
    """

    name: str
    cron: str
    type: str
    payload: Any
    timezone: str
    catch_up: bool
    submit_options: Mapping[str, Any]

    def __init__(
        self,
        name: str,
        cron: str,
        type: str,
        payload: Any = None,
        *,
        timezone: str = "UTC",
        catch_up: bool = False,
        **submit_options: Any,
    ) -> None:
        _check_name(name)
        if not isinstance(type, str) or not type:
            raise ConfigError(f"schedule {name!r}: type must be a non-empty string, got {type!r}")
        if not isinstance(catch_up, bool):
            raise ConfigError(f"schedule {name!r}: catch_up must be a bool, got {catch_up!r}")
        taken = sorted(set(submit_options) & set(_SET_BY_SCHEDULE))
        if taken:
            raise ConfigError(
                f"schedule {name!r}: {', '.join(taken)} cannot be given: the schedule sets the "
                "business key and run_at of each tick's task"
            )
        try:
            Cron(cron, timezone)
        except ConfigError as exc:
            raise ConfigError(f"schedule {name!r}: {exc}") from None
        for attr, value in (
            ("name", name),
            ("cron", cron),
            ("type", type),
            ("payload", payload),
            ("timezone", timezone),
            ("catch_up", catch_up),
            ("submit_options", MappingProxyType(dict(submit_options))),
        ):
            object.__setattr__(self, attr, value)

    def __hash__(self) -> int:
        return hash((self.name, self.cron, self.type, self.timezone))

    @classmethod
    def from_mapping(cls, data: object, *, where: str = "schedule") -> Schedule:
        """Build from a mapping of the constructor's keywords (``name``, ``cron`` and ``type``
        required; ``payload``, ``timezone``, ``catch_up`` and submit options optional), as an
        app's YAML gives it (`Config.from_mapping`'s ``schedules``)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}: {data!r}")
        odd = sorted(repr(k) for k in data if not isinstance(k, str))
        if odd:
            raise ConfigError(f"{where}: keys must be strings, got {', '.join(odd)}")
        missing = [k for k in ("name", "cron", "type") if k not in data]
        if missing:
            raise ConfigError(f"{where}: {', '.join(repr(k) for k in missing)} required")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def ticks(self) -> Cron:
        """The schedule's tick instants (`Cron`)."""
        return Cron(self.cron, self.timezone)

    def key(self, tick: datetime) -> str:
        """The business key of the task for ``tick`` (`tick_key`)."""
        return tick_key(self.name, tick)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"schedule name must be a non-empty string, got {name!r}")
    if len(name) > _MAX_NAME:
        raise ConfigError(
            f"schedule name is {len(name)} characters long; at most {_MAX_NAME} allowed (its "
            f"business keys must fit {MAX_ID_LENGTH})"
        )
    if "\x00" in name:
        raise ConfigError(f"schedule name must not contain NUL characters: {name!r}")
