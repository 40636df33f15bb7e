"""What the command line shows for values the end-to-end tests do not meet: bytes that are not
JSON, an indefinite hold, durations, alignment."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

from taskgate import Status, Task
from taskgate.cli.output import print_kv, print_table, task_json, text

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def test_bytes_that_are_not_json_are_shown_as_base64() -> None:
    task = Task("t1", "blob", "q", b"\xff\x00", Status.COMPLETED, NOW, NOW, result=b"plain text")

    shown = task_json(task)

    assert (shown["payload"], shown["payload_base64"]) == (None, "/wA=")
    assert (shown["result"], shown["result_base64"]) == (None, "cGxhaW4gdGV4dA==")
    assert "cancel_requested" not in shown and shown["progress"] is None


def test_json_bodies_and_progress_are_decoded() -> None:
    task = Task("t1", "t", "q", b'{"a": 1}', Status.PENDING, NOW, NOW, progress_json="[1, 2]")

    shown = task_json(task)

    assert (shown["payload"], shown["progress"], shown["status"]) == ({"a": 1}, [1, 2], Status.PENDING)
    assert "payload_base64" not in shown


def test_cells_name_an_indefinite_hold_and_durations_in_seconds() -> None:
    assert text(datetime.max.replace(tzinfo=UTC)) == "until resumed"
    assert text(NOW) == "2026-12-05T12:00:00+00:00"
    assert text(timedelta(minutes=1, milliseconds=500)) == "60.5s"
    assert (text(None), text(True), text(("a", "b"))) == ("", "yes", "a, b")


def test_tables_align_columns_and_blocks_indent_multiline_values() -> None:
    table, block = io.StringIO(), io.StringIO()

    print_table([{"id": "long-id", "n": 1}, {"id": "x", "n": None}], ["id", "n"], table)
    print_kv([("id", "x"), ("payload", '{\n  "a": 1\n}')], block)

    assert table.getvalue() == "id       n\nlong-id  1\nx\n"
    assert block.getvalue() == 'id:      x\npayload:\n    {\n      "a": 1\n    }\n'
