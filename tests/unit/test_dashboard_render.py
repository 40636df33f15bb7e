"""How the dashboard turns stored values into text (`taskgate.dashboard.render`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from taskgate.brokers.params import HELD_INDEFINITELY
from taskgate.dashboard.render import (
    MAX_HEX,
    MAX_SHOWN,
    show_bytes,
    show_json_text,
    show_time,
    show_timedelta,
)


def test_json_is_indented_and_keeps_non_ascii_text() -> None:
    shown = show_bytes('{"name":"Zoë","n":[1,2]}'.encode())
    assert shown.kind == "json"
    assert shown.text == '{\n  "name": "Zoë",\n  "n": [\n    1,\n    2\n  ]\n}'


def test_text_that_is_not_json_is_shown_as_it_is() -> None:
    assert show_bytes(b"hello <b>").kind == "text"
    assert show_bytes(b"hello <b>").text == "hello <b>"


def test_bytes_that_are_not_utf8_are_shown_as_hex_lines_up_to_a_limit() -> None:
    shown = show_bytes(bytes(range(256)) * 4)
    assert shown.kind == "bytes" and shown.size == 1024 and shown.cut
    assert shown.text.splitlines()[0] == "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f"
    assert len(shown.text.splitlines()) == MAX_HEX // 16


def test_a_long_value_is_cut_and_says_so() -> None:
    shown = show_bytes(b"x" * (MAX_SHOWN + 10))
    assert shown.cut and len(shown.text) == MAX_SHOWN and shown.size == MAX_SHOWN + 10
    assert show_bytes(None).kind == "none"


def test_progress_json_is_indented() -> None:
    assert show_json_text('{"done":1}').text == '{\n  "done": 1\n}'
    assert show_json_text(None).kind == "none"


def test_times_read_in_utc_and_a_hold_without_end_reads_until_resumed() -> None:
    assert show_time(datetime(2026, 12, 5, 13, 0, tzinfo=UTC)) == "2026-12-05 13:00:00 UTC"
    assert show_time(HELD_INDEFINITELY) == "until resumed"
    assert show_time(None) == ""


def test_durations_read_in_hours_minutes_seconds() -> None:
    assert show_timedelta(timedelta(hours=1, minutes=2, seconds=3)) == "1h2m3s"
    assert show_timedelta(timedelta(milliseconds=250)) == "250ms"
    assert show_timedelta(timedelta(minutes=10)) == "10m"
