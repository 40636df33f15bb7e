from __future__ import annotations

from datetime import timedelta

import pytest

from taskgate.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("60s", 60),
        ("10m", 600),
        ("1h30m", 5400),
        ("24h", 86400),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("2d", 172800),
        ("45", 45),
        (" 5s ", 5),
    ],
)
def test_strings_read_as_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, field="f") == timedelta(seconds=seconds)


def test_numbers_are_seconds_and_timedeltas_pass_through() -> None:
    assert parse_duration(3, field="f") == timedelta(seconds=3)
    assert parse_duration(0.5, field="f") == timedelta(seconds=0.5)
    assert parse_duration(timedelta(minutes=2), field="f") == timedelta(minutes=2)


@pytest.mark.parametrize("bad", ["", "s", "10x", "1h 30m", "m10", "1h30", "nan", "inf", "--5s"])
def test_unreadable_strings_name_the_field(bad: str) -> None:
    with pytest.raises(ValueError, match="lease_ttl"):
        parse_duration(bad, field="lease_ttl")


@pytest.mark.parametrize("bad", [True, None, [1], float("nan"), float("inf")])
def test_non_durations_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="quota_period"):
        parse_duration(bad, field="quota_period")  # type: ignore[arg-type]
