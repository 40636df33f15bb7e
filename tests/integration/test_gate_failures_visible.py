"""A handler's failure is visible: one record on logger ``taskgate.handler`` (WARNING when it
will be retried, ERROR when final) with the exception and the task, and the traceback stored
as ``Task.last_traceback`` (its newest 8 KiB) -- on all five backends."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from gate_helpers import GUARD, eventually, make_gate

from taskgate import QueueConfig, Status, Task, TaskFailedError, Throttled
from taskgate.brokers.base import Broker
from taskgate.brokers.checks import MAX_TRACEBACK_BYTES

pytestmark = pytest.mark.anyio

LONG_LEASE = {"q": QueueConfig(workers=2, lease_ttl="1h")}
ANY_TYPE = {"routes": dict.fromkeys(("deep", "long", "broken", "surrogate"), "q")}


class Records(logging.Handler):
    """Keeps the records of logger ``taskgate.handler`` (caplog's handler sits on the root, and
    the level must be open on this logger whatever the test run configured)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def of(self, task_id: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "task_id", None) == task_id]


@pytest.fixture
def handler_log() -> Iterator[Records]:
    logger = logging.getLogger("taskgate.handler")
    records, level = Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(records)
    logger.setLevel(level)


def explode_while_fetching(task: Task) -> None:
    raise ConnectionError(f"gateway refused task {task.id}")


async def test_a_failure_that_will_be_retried_is_a_warning_with_its_traceback(
    broker: Broker, handler_log: Records
) -> None:
    gate = make_gate(broker, LONG_LEASE, max_retry=3)

    @gate.handler("q")
    async def fetch(task: Task) -> None:
        explode_while_fetching(task)

    async with gate:
        task_id = await gate.submit("q")
        task = await eventually(gate, task_id, lambda t: t.status is Status.RETRYING)

    (record,) = handler_log.of(task_id)
    assert record.levelno == logging.WARNING
    assert record.exc_info is not None and isinstance(record.exc_info[1], ConnectionError)
    assert (record.task_type, record.queue, record.attempts, record.max_retry) == ("q", "q", 1, 3)  # type: ignore[attr-defined]
    assert task_id in record.getMessage() and "retrying" in record.getMessage()
    assert task.last_traceback is not None
    assert "explode_while_fetching" in task.last_traceback
    assert task.last_traceback.rstrip().endswith(f"ConnectionError: gateway refused task {task_id}")


async def test_a_final_failure_is_an_error_with_its_traceback(broker: Broker, handler_log: Records) -> None:
    gate = make_gate(broker, LONG_LEASE, max_retry=0)

    @gate.handler("q")
    async def fetch(task: Task) -> None:
        explode_while_fetching(task)

    async with gate:
        task_id = await gate.submit("q")
        with pytest.raises(TaskFailedError) as failed:
            await gate.wait(task_id, timeout=GUARD)

    (record,) = handler_log.of(task_id)
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and isinstance(record.exc_info[1], ConnectionError)
    assert "failed for good" in record.getMessage()
    stored = failed.value.task.last_traceback
    assert stored is not None and "explode_while_fetching" in stored
    assert (await gate.get(task_id)).last_traceback == stored


async def test_a_throttle_is_logged_at_info_without_a_traceback(broker: Broker, handler_log: Records) -> None:
    gate = make_gate(broker, LONG_LEASE)

    @gate.handler("q")
    async def busy(task: Task) -> None:
        raise Throttled(retry_after=60)

    async with gate:
        task_id = await gate.submit("q")
        await eventually(gate, task_id, lambda t: t.status is Status.RETRYING)

    (record,) = handler_log.of(task_id)
    assert record.levelno == logging.INFO and record.exc_info is None
    assert record.throttled == 1  # type: ignore[attr-defined]


def ping(depth: int) -> None:
    if depth == 0:
        raise ValueError("bottom of a deep stack")
    pong(depth - 1)


def pong(depth: int) -> None:
    ping(depth - 1)  # two functions in turn: no run of repeated frames for Python to fold


def innermost_frame_raises() -> None:
    raise KeyError("x" * 20_000)  # the exception's own text alone is beyond 8 KiB


async def test_a_huge_traceback_is_stored_as_its_newest_eight_kib(
    broker: Broker, handler_log: Records
) -> None:
    gate = make_gate(broker, LONG_LEASE, **ANY_TYPE)

    @gate.handler("deep")
    async def deep(task: Task) -> None:
        try:
            ping(300)
        except ValueError as exc:
            raise RuntimeError("wrapped") from exc

    @gate.handler("long")
    async def long(task: Task) -> None:
        innermost_frame_raises()

    async with gate:
        deep_id = await gate.submit("deep")
        long_id = await gate.submit("long")
        deep_task = await eventually(gate, deep_id, lambda t: t.status is Status.FAILED)
        long_task = await eventually(gate, long_id, lambda t: t.status is Status.FAILED)

    for task in (deep_task, long_task):
        assert task.last_traceback is not None
        assert len(task.last_traceback.encode("utf-8")) <= MAX_TRACEBACK_BYTES
        assert task.last_traceback.startswith("[older frames cut]")
    assert deep_task.last_traceback.rstrip().endswith("RuntimeError: wrapped")  # type: ignore[union-attr]
    assert "in deep" in deep_task.last_traceback  # type: ignore[operator]
    assert long_task.last_traceback.rstrip().endswith("x" * 100 + "'")  # type: ignore[union-attr]
    assert [r.levelno for r in handler_log.of(deep_id)] == [logging.ERROR]


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


async def test_an_exception_whose_text_breaks_or_cannot_be_encoded_still_ends_its_task(
    broker: Broker, handler_log: Records
) -> None:
    gate = make_gate(broker, LONG_LEASE, **ANY_TYPE)

    @gate.handler("broken")
    async def broken(task: Task) -> None:
        raise BrokenStr()

    @gate.handler("surrogate")
    async def surrogate(task: Task) -> None:
        raise ValueError("bad bytes \udcff and a NUL \x00 here")

    async with gate:
        ids = [await gate.submit("broken"), await gate.submit("surrogate")]
        tasks = [await eventually(gate, i, lambda t: t.status is Status.FAILED) for i in ids]

    for task in tasks:
        assert task.last_traceback is not None
        task.last_traceback.encode("utf-8")
        assert "\x00" not in task.last_traceback
        assert [r.levelno for r in handler_log.of(task.id)] == [logging.ERROR]
    assert "BrokenStr" in tasks[0].last_traceback  # type: ignore[operator]
    assert "\\udcff" in tasks[1].last_traceback  # type: ignore[operator]


class Exploding(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        raise RuntimeError("the log sink is down")

    def handleError(self, record: logging.LogRecord) -> None:
        raise RuntimeError("and so is its error path")


async def test_a_logging_setup_that_raises_never_reaches_the_runtime(gate_broker: Broker) -> None:
    logger = logging.getLogger("taskgate.handler")
    exploding = Exploding()
    logger.addHandler(exploding)
    try:
        gate = make_gate(gate_broker, LONG_LEASE, max_retry=0)

        @gate.handler("q")
        async def fails(task: Task) -> None:
            raise ValueError("boom")

        async with gate:
            task_id = await gate.submit("q")
            with pytest.raises(TaskFailedError) as failed:
                await gate.wait(task_id, timeout=GUARD)
    finally:
        logger.removeHandler(exploding)
    assert failed.value.task.status is Status.FAILED
    assert "ValueError: boom" in (failed.value.task.last_traceback or "")
