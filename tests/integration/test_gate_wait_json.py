"""`gate.wait_json`: the result decoded, on every backend."""

from __future__ import annotations

import pytest
from gate_helpers import GUARD, make_gate

from taskgate import Task, TaskFailedError

pytestmark = pytest.mark.anyio


async def test_wait_json_answers_what_the_handler_returned_decoded(broker):
    gate = make_gate(broker)

    @gate.handler("q")
    async def answer(task: Task) -> object:
        return {"echo": task.json(), "n": [1, 2.5, None]}

    async with gate:
        task_id = await gate.submit("q", {"q": "é"})
        assert await gate.wait_json(task_id, timeout=GUARD) == {"echo": {"q": "é"}, "n": [1, 2.5, None]}


async def test_wait_json_answers_none_for_no_result(broker):
    gate = make_gate(broker)
    gate.handle("q", lambda task: None)

    async with gate:
        assert await gate.wait_json(await gate.submit("q"), timeout=GUARD) is None


async def test_wait_json_on_raw_bytes_raises_value_error_naming_the_task_and_wait_still_reads_them(broker):
    gate = make_gate(broker)
    gate.handle("q", lambda task: b"\xff not json")

    async with gate:
        task_id = await gate.submit("q")
        with pytest.raises(ValueError, match=f"the result of {task_id} is not JSON"):
            await gate.wait_json(task_id, timeout=GUARD)
        assert await gate.wait(task_id, timeout=GUARD) == b"\xff not json"


async def test_wait_json_raises_task_failed_error_like_wait(gate_broker):
    gate = make_gate(gate_broker)

    @gate.handler("q")
    async def broken(task: Task) -> None:
        raise RuntimeError("boom")

    async with gate:
        task_id = await gate.submit("q")
        with pytest.raises(TaskFailedError):
            await gate.wait_json(task_id, timeout=GUARD)
