"""Tick instants of cron schedules (`taskgate.schedules.Cron`), their keys, and `Schedule`'s checks.

The DST cases are Europe/Berlin's 2026 changes: spring forward on 2026-03-29 at 02:00 CET
(01:00 UTC) to 03:00 CEST, fall back on 2026-10-25 at 03:00 CEST (01:00 UTC) to 02:00 CET;
and America/New_York's (2026-03-08 and 2026-11-01, at 02:00 local).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskgate import ConfigError, Schedule
from taskgate.schedules import Cron, tick_key


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def forward(cron: Cron, start: datetime, until: datetime) -> list[datetime]:
    ticks, tick = [], cron.after(start)
    while tick is not None and tick <= until:
        ticks.append(tick)
        tick = cron.after(tick)
    return ticks


def backward(cron: Cron, end: datetime, since: datetime) -> list[datetime]:
    ticks, tick = [], cron.at_or_before(end)
    while tick is not None and tick > since:
        ticks.append(tick)
        tick = cron.before(tick)
    return ticks[::-1]


def test_the_key_names_the_schedule_and_the_tick_in_utc() -> None:
    tick = datetime(2026, 3, 29, 3, 0, tzinfo=Cron("* * * * *", "Europe/Berlin").zone)
    assert tick_key("nightly", tick) == "schedule:nightly:2026-03-29T01:00:00+00:00"


def test_utc_ticks_are_the_expression_s_instants() -> None:
    cron = Cron("*/15 * * * *")
    assert forward(cron, utc(2026, 1, 1, 9, 50), utc(2026, 1, 1, 10, 30)) == [
        utc(2026, 1, 1, 10, 0),
        utc(2026, 1, 1, 10, 15),
        utc(2026, 1, 1, 10, 30),
    ]


def test_a_tick_exactly_now_is_due_and_the_next_one_is_after_it() -> None:
    cron = Cron("0 * * * *")
    assert cron.at_or_before(utc(2026, 1, 1, 10, 0)) == utc(2026, 1, 1, 10, 0)
    assert cron.at_or_before(utc(2026, 1, 1, 9, 59, 59, 999_999)) == utc(2026, 1, 1, 9, 0)
    assert cron.before(utc(2026, 1, 1, 10, 0)) == utc(2026, 1, 1, 9, 0)
    assert cron.after(utc(2026, 1, 1, 10, 0)) == utc(2026, 1, 1, 11, 0)


def test_six_fields_tick_by_the_second() -> None:
    cron = Cron("*/20 * * * * *")
    assert forward(cron, utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 1, 0)) == [
        utc(2026, 1, 1, 0, 0, 20),
        utc(2026, 1, 1, 0, 0, 40),
        utc(2026, 1, 1, 0, 1, 0),
    ]


def test_a_daily_time_that_does_not_exist_on_spring_forward_ticks_just_after_the_gap() -> None:
    cron = Cron("30 2 * * *", "Europe/Berlin")
    assert forward(cron, utc(2026, 3, 27, 12), utc(2026, 3, 30, 12)) == [
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),  # 02:30 does not exist: 03:00 CEST
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


def test_a_daily_time_that_occurs_twice_on_fall_back_ticks_once_at_the_first() -> None:
    cron = Cron("30 2 * * *", "Europe/Berlin")
    assert forward(cron, utc(2026, 10, 23, 12), utc(2026, 10, 26, 12)) == [
        utc(2026, 10, 24, 0, 30),  # 02:30 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, not again at 02:30 CET
        utc(2026, 10, 26, 1, 30),  # 02:30 CET
    ]


def test_an_hourly_cron_ticks_every_real_hour_across_fall_back() -> None:
    cron = Cron("0 * * * *", "Europe/Berlin")
    assert forward(cron, utc(2026, 10, 24, 22, 30), utc(2026, 10, 25, 3)) == [
        utc(2026, 10, 24, 23),  # 01:00 CEST
        utc(2026, 10, 25, 0),  # 02:00 CEST
        utc(2026, 10, 25, 1),  # 02:00 CET, the second 02:00
        utc(2026, 10, 25, 2),  # 03:00 CET
        utc(2026, 10, 25, 3),  # 04:00 CET
    ]


def test_new_york_s_changes_follow_the_same_rules() -> None:
    daily = Cron("30 2 * * *", "America/New_York")
    assert forward(daily, utc(2026, 3, 7, 12), utc(2026, 3, 9, 12)) == [
        utc(2026, 3, 8, 7, 0),  # 02:30 EST does not exist: 03:00 EDT
        utc(2026, 3, 9, 6, 30),
    ]
    repeated = Cron("30 1 * * *", "America/New_York")  # 01:00-02:00 comes twice on 2026-11-01
    assert forward(repeated, utc(2026, 10, 31, 12), utc(2026, 11, 2, 12)) == [
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT only
        utc(2026, 11, 2, 6, 30),  # 01:30 EST
    ]
    hourly = Cron("0 * * * *", "America/New_York")
    assert forward(hourly, utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 7, 30)) == [
        utc(2026, 11, 1, 5),  # 01:00 EDT
        utc(2026, 11, 1, 6),  # 01:00 EST
        utc(2026, 11, 1, 7),  # 02:00 EST
    ]


@pytest.mark.parametrize(
    ("expression", "zone", "start", "end"),
    [
        ("30 2 * * *", "Europe/Berlin", utc(2026, 3, 20), utc(2026, 4, 5)),
        ("30 2 * * *", "Europe/Berlin", utc(2026, 10, 18), utc(2026, 11, 2)),
        ("15 2 * * *", "Europe/Berlin", utc(2026, 10, 25, 0), utc(2026, 10, 25, 1, 10)),
        ("0 * * * *", "Europe/Berlin", utc(2026, 10, 24, 20), utc(2026, 10, 25, 6)),
        ("*/20 1-3 * * *", "America/New_York", utc(2026, 10, 31), utc(2026, 11, 2)),
        ("0 0 * * MON", "UTC", utc(2026, 1, 1), utc(2026, 3, 1)),
    ],
)
def test_walking_back_finds_exactly_the_ticks_walking_forward_found(
    expression: str, zone: str, start: datetime, end: datetime
) -> None:
    cron = Cron(expression, zone)
    assert backward(cron, end, start) == forward(cron, start, end)


@given(
    st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31)),
    st.sampled_from(["30 2 * * *", "0 * * * *", "*/7 1-3 * * *", "0 3 1 * *"]),
    st.sampled_from(["Europe/Berlin", "America/New_York", "UTC", "Australia/Lord_Howe"]),
)
def test_the_latest_tick_at_or_before_any_instant_is_the_one_before_the_next(
    when: datetime, expression: str, zone: str
) -> None:
    cron, t = Cron(expression, zone), when.replace(tzinfo=UTC)
    latest = cron.at_or_before(t)
    assert latest is not None and latest <= t
    following = cron.after(latest)
    assert following is not None and following > t


def test_a_schedule_keeps_its_arguments_and_names_its_keys() -> None:
    schedule = Schedule(
        "report", "0 6 * * *", "make_report", {"to": "ops"}, timezone="Europe/Berlin", max_retry=2
    )
    assert (schedule.name, schedule.cron, schedule.type, schedule.payload) == (
        "report",
        "0 6 * * *",
        "make_report",
        {"to": "ops"},
    )
    assert (schedule.timezone, schedule.catch_up, dict(schedule.submit_options)) == (
        "Europe/Berlin",
        False,
        {"max_retry": 2},
    )
    assert schedule.key(utc(2026, 5, 1, 4)) == "schedule:report:2026-05-01T04:00:00+00:00"
    with pytest.raises(AttributeError):
        schedule.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("args", "options", "names"),
    [
        (("s", "61 * * * *", "t"), {}, "invalid cron expression '61 * * * *'"),
        (("s", "* * *", "t"), {}, "invalid cron expression"),
        (("s", "every day", "t"), {}, "invalid cron expression"),
        (("s", 5, "t"), {}, "cron expression must be a str"),
        (("s", "* * * * *", "t"), {"timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        (("s", "* * * * *", "t"), {"timezone": ""}, "timezone must be an IANA time zone name"),
        (("s", "* * * * *", "t"), {"business_key": "k"}, "business_key cannot be given"),
        (("s", "* * * * *", "t"), {"run_at": utc(2026, 1, 1)}, "run_at cannot be given"),
        (("s", "* * * * *", "t"), {"delay": "1m"}, "delay cannot be given"),
        (("s", "* * * * *", "t"), {"catch_up": "yes"}, "catch_up must be a bool"),
        (("", "* * * * *", "t"), {}, "schedule name must be a non-empty string"),
        (("x" * 300, "* * * * *", "t"), {}, "schedule name is 300 characters long"),
        (("s", "* * * * *", ""), {}, "type must be a non-empty string"),
    ],
)
def test_a_bad_schedule_raises_a_config_error_naming_what_is_wrong(
    args: tuple[Any, ...], options: dict[str, Any], names: str
) -> None:
    with pytest.raises(ConfigError, match=_escaped(names)):
        Schedule(*args, **options)


def test_the_longest_name_allowed_still_makes_keys_that_fit() -> None:
    longest = 255 - len("schedule::2026-03-29T01:00:00+00:00")
    schedule = Schedule("n" * longest, "* * * * *", "t")
    assert len(schedule.key(utc(9999, 12, 31, 23, 59))) == 255
    with pytest.raises(ConfigError, match="characters long"):
        Schedule("n" * (longest + 1), "* * * * *", "t")


def test_an_expression_that_never_matches_is_refused() -> None:
    with pytest.raises(ConfigError, match="invalid cron expression"):
        Cron("0 0 30 2 *")


def test_ticks_are_whole_seconds_in_utc() -> None:
    tick = Cron("*/5 * * * * *", "Asia/Kolkata").at_or_before(utc(2026, 6, 1, 12, 0, 7, 500))
    assert tick == utc(2026, 6, 1, 12, 0, 5) and tick.tzinfo is UTC
    assert Cron("* * * * *").after(utc(2026, 6, 1, 12, 0, 7)) - utc(2026, 6, 1, 12, 0) == timedelta(minutes=1)


def _escaped(text: str) -> str:
    import re

    return re.escape(text)
