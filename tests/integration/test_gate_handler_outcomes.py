"""Nothing a handler returns or raises stops the gate: every task ends with a readable error.

On all five backends, each with the test's `ManualClock` (retries fall due when the test
moves it; no lease expires meanwhile). The property test at the end draws handlers that
raise odd exceptions, build bad `Throttled`, or return values nothing can store.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from gate_helpers import GUARD, Faulty, eventually, make_gate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from taskgate import (
    ConfigError,
    ManualClock,
    QueueConfig,
    SkipRetry,
    Status,
    Task,
    TaskNotFoundError,
    Throttled,
)
from taskgate.brokers.base import Broker
from taskgate.brokers.checks import MAX_ERROR_LENGTH
from taskgate.brokers.sql import SQLBroker  # type: ignore[attr-defined]
from taskgate.brokers.sql.engine import normalize_url
from taskgate.errors import BrokerError

pytestmark = pytest.mark.anyio

# Long enough that moving the clock to a retry's due time never expires a running lease.
LONG_LEASE = QueueConfig(workers=2, lease_ttl="1h")


def assert_readable(error: str | None, *fragments: str) -> None:
    """``error`` is a stored ``last_error`` anyone can read, naming each of ``fragments``."""
    assert error is not None
    assert "\x00" not in error and len(error) <= MAX_ERROR_LENGTH
    error.encode("utf-8")  # no lone surrogate
    for fragment in fragments:
        assert fragment in error


async def wait_final(gate: Any, task_id: str) -> Task:
    return await eventually(gate, task_id, lambda t: t.status.is_final)


class BrokenStr(Exception):
    """An exception whose text cannot be read: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class NotAnException(BaseException):
    """A handler's own exception outside the `Exception` hierarchy (not an exit or a cancel)."""


class NotAStr(Exception):
    """An exception whose ``__str__`` answers something else than a str."""

    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


# -- one bad handler output at a time ----------------------------------------------------------

RAISES: dict[str, tuple[Callable[[], BaseException], tuple[str, ...]]] = {
    "throttled-inf": (lambda: Throttled(retry_after=math.inf), ("ValueError", "retry_after")),
    "throttled-nan": (lambda: Throttled(retry_after=math.nan), ("ValueError", "retry_after")),
    "throttled-1e12": (lambda: Throttled(retry_after=1e12), ("ValueError", "retry_after")),
    "surrogate": (lambda: OSError("cannot open \udcff.txt"), ("OSError: cannot open \\udcff.txt",)),
    "nul": (lambda: SkipRetry("bad\x00name"), ("SkipRetry: bad\\x00name",)),
    "str-raises": (lambda: BrokenStr(), ("BrokenStr", "RuntimeError")),
    "str-not-a-str": (lambda: NotAStr(), ("NotAStr", "TypeError")),
    "enormous": (lambda: ValueError("e" * 1_000_000), ("ValueError: eee", "cut from")),
    "base-exception": (lambda: NotAnException("gave up"), ("NotAnException: gave up",)),
}


@pytest.mark.parametrize("case", sorted(RAISES))
async def test_a_handler_raising_something_unstorable_fails_its_task_and_the_gate_goes_on(
    broker: Broker, case: str
) -> None:
    make, fragments = RAISES[case]
    gate = make_gate(broker, {"q": LONG_LEASE}, max_retry=0)

    @gate.handler("q")
    async def bad(task: Task) -> str:
        if task.json() == "bad":
            raise make()
        return "fine"

    async with gate:
        failed = await wait_final(gate, await gate.submit("q", "bad"))
        assert await gate.wait(await gate.submit("q", "good"), timeout=GUARD) == b'"fine"'
    assert (failed.status, failed.attempts, failed.throttled, failed.claims) == (Status.FAILED, 1, 0, 1)
    assert_readable(failed.last_error, *fragments)


async def test_a_result_the_codec_refuses_fails_once_without_retrying(broker: Broker) -> None:
    gate = make_gate(broker, {"q": LONG_LEASE}, max_retry=3)
    gate.handle("q", lambda task: {"a", "set"})
    async with gate:
        failed = await wait_final(gate, await gate.submit("q"))
    assert (failed.status, failed.attempts, failed.claims) == (Status.FAILED, 1, 1)
    assert_readable(failed.last_error, "could not be stored", "JSON-serialisable")


# Every call that writes an ack: a settle completing runs (alone or in a batch, with snapshots
# or not), or a claim carrying acks; the failure of a refused result is a settle of its own.
ACK_CALLS = ("settle.complete", "claim.acks")


async def test_an_ack_the_broker_refuses_fails_its_task_once_with_the_reason(broker: Broker) -> None:
    refusing = Faulty(broker)
    refusing.failing = dict.fromkeys(ACK_CALLS, ValueError("result of task x is too large"))
    gate = make_gate(refusing, {"q": LONG_LEASE}, max_retry=3)
    ran: list[str] = []

    @gate.handler("q")
    async def big(task: Task) -> str:
        ran.append(task.id)
        return "big"

    async with gate:
        ids = await gate.submit_many("q", [None] * 3)
        failed = [await wait_final(gate, task_id) for task_id in ids]
    assert sorted(ran) == sorted(ids)  # each ran once
    for task in failed:
        assert (task.status, task.attempts, task.claims, task.lease_lost) == (Status.FAILED, 1, 1, 0)
        assert_readable(task.last_error, "could not be stored", "ValueError: result of task x is too large")


async def test_a_result_larger_than_mysql_accepts_fails_once_with_the_reason(mysql_url: str) -> None:
    engine = create_engine(normalize_url(mysql_url))
    with engine.connect() as conn:
        packet = int(conn.execute(text("SELECT @@max_allowed_packet")).scalar_one())
    engine.dispose()
    broker = SQLBroker(mysql_url, clock=ManualClock())
    try:
        gate = make_gate(broker, {"q": LONG_LEASE}, max_retry=3)
        gate.handle("q", lambda task: b"x" * packet)
        async with gate:
            failed = await wait_final(gate, await gate.submit("q"))
    finally:
        broker.close()
    assert (failed.status, failed.attempts, failed.claims, failed.lease_lost) == (Status.FAILED, 1, 1, 0)
    assert_readable(failed.last_error, "could not be stored", "max_allowed_packet")


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_cancelled_sync_handler_keeps_its_slot_until_its_thread_returns(broker: Broker) -> None:
    gate = make_gate(broker, {"q": QueueConfig(workers=1)})
    release, first_started = threading.Event(), threading.Event()
    second_started = anyio.Event()
    overlapped: list[bool] = []

    @gate.handler("q")
    def blocking(task: Task) -> None:
        if task.json() == "first":
            first_started.set()
            release.wait(GUARD)
        else:
            overlapped.append(not release.is_set())
            anyio.from_thread.run_sync(second_started.set)

    try:
        async with gate:
            first = await gate.submit("q", "first")
            second = await gate.submit("q", "second")
            with anyio.fail_after(GUARD):
                await anyio.to_thread.run_sync(first_started.wait, GUARD)
            await gate.cancel(first)
            await eventually(gate, first, lambda t: t.status is Status.CANCELED)
            with anyio.move_on_after(0.5):  # a slot freed at the cancel starts it at once
                await second_started.wait()
            assert not second_started.is_set() and (await gate.get(second)).status is Status.PENDING
            release.set()
            with anyio.fail_after(GUARD):
                await second_started.wait()
            await eventually(gate, second, lambda t: t.status is Status.COMPLETED)
    finally:
        release.set()
    assert overlapped == [False]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_shutdown_does_not_wait_for_a_stuck_sync_handler_past_its_timeout(broker: Broker) -> None:
    # The guard of the slot kept above: the worker does not wait for the thread, so shutdown's
    # timeout still ends the run and puts the task back.
    gate = make_gate(broker, {"q": QueueConfig(workers=1)})
    release, started = threading.Event(), threading.Event()

    @gate.handler("q")
    def stuck(task: Task) -> None:
        started.set()
        release.wait(GUARD)

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(gate.run)
            task_id = await gate.submit("q")
            with anyio.fail_after(GUARD):
                await anyio.to_thread.run_sync(started.wait, GUARD)
                await gate.shutdown(timeout=0.05)
        assert not release.is_set()  # shut down while the thread still runs
        assert (await gate.get(task_id)).status is Status.PENDING
    finally:
        release.set()


# -- the property: drawn handler behaviours, one gate per example -----------------------------

MAX_RETRY, THROTTLED_MAX = 2, 2


@dataclass(frozen=True)
class Behaviour:
    """What a handler does on every run of one task, and the final state that must follow."""

    kind: str  # "return", "unstorable", "raise", "skip", "throttle"
    value: Any = None

    def run(self) -> Any:
        match self.kind:
            case "return" | "unstorable":
                return self.value
            case "throttle":
                raise Throttled(retry_after=self.value)
            case "bad-throttle":
                raise Throttled(retry_after=self.value)  # ValueError now: a business failure
            case _:
                raise self.value()

    def expected(self) -> tuple[Status, int, int]:
        """(status, attempts, throttled) at the end: each run counted exactly once."""
        match self.kind:
            case "return":
                return Status.COMPLETED, 0, 0
            case "unstorable" | "skip":
                return Status.FAILED, 1, 0
            case "throttle":
                return Status.FAILED, 0, THROTTLED_MAX + 1
        return Status.FAILED, MAX_RETRY + 1, 0


_texts = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec=None, exclude_categories=[]), max_size=20),  # lone surrogates, NUL
    st.sampled_from(["\x00", "\udcff", "a\x00\udc80b", "x" * 20_000]),
)


def _error(cls: type[Exception], message: str) -> Callable[[], Exception]:
    return lambda: cls(message)


def _circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


_raising = st.one_of(
    st.builds(
        _error,
        # taskgate's own errors too: raised by a handler, they are its failures like any other
        st.sampled_from(
            [
                ValueError,
                KeyError,
                OverflowError,
                RuntimeError,
                OSError,
                BrokerError,
                TaskNotFoundError,
                ConfigError,
            ]
        ),
        _texts,
    ),
    st.sampled_from([BrokenStr, NotAStr, lambda: UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates")]),
)

behaviours = st.one_of(
    st.builds(
        Behaviour,
        st.just("return"),
        st.one_of(st.none(), st.integers(), st.text(max_size=20), st.binary(max_size=20)),
    ),
    st.builds(
        Behaviour,
        st.just("unstorable"),
        st.sampled_from([{1, 2}, object(), math.nan, math.inf, _circular(), b"ok".decode, {(1, 2): 3}]),
    ),
    st.builds(Behaviour, st.just("raise"), _raising),
    st.builds(Behaviour, st.just("skip"), st.builds(lambda m: lambda: SkipRetry(m), _texts)),
    st.builds(
        Behaviour,
        st.just("throttle"),
        st.one_of(st.floats(0, 120), st.just(Throttled.MAX_RETRY_AFTER), st.integers(0, 60)),
    ),
    st.builds(
        Behaviour,
        st.just("bad-throttle"),
        st.one_of(
            st.floats(max_value=-1e-9),
            st.floats(min_value=Throttled.MAX_RETRY_AFTER, exclude_min=True),
            st.sampled_from([math.nan, math.inf, -math.inf, 10**400]),
        ),
    ),
)


async def _drive_until_final(gate: Any, clock: ManualClock, ids: list[str]) -> list[Task]:
    """Move the clock to each next retry's due time until every task is final.

    The clock moves only while no task can be claimed (each is final or due later), so no
    running lease ever sees its time jump."""
    with anyio.fail_after(GUARD * 4):
        while True:
            tasks = [await gate.get(task_id) for task_id in ids]
            if all(t.status.is_final for t in tasks):
                return tasks
            waiting = [t for t in tasks if not t.status.is_final]
            if all(t.status is Status.RETRYING and t.run_at > clock.now() for t in waiting):
                clock.advance((max(t.run_at for t in waiting) - clock.now()).total_seconds())
            await anyio.sleep(0.005)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(drawn=st.lists(behaviours, min_size=1, max_size=4))
async def test_whatever_handlers_do_the_gate_goes_on_and_each_task_is_counted_once(
    broker: Broker, clock: ManualClock, drawn: list[Behaviour]
) -> None:
    gate = make_gate(broker, {"q": LONG_LEASE}, max_retry=MAX_RETRY, throttled_max=THROTTLED_MAX)
    runs: dict[str, int] = {}

    @gate.handler("q")
    def drawn_handler(task: Task) -> Any:
        runs[task.id] = runs.get(task.id, 0) + 1
        index = task.json()
        return "after" if index is None else drawn[index].run()

    async with gate:
        ids = await gate.submit_many("q", list(range(len(drawn))))
        final = await _drive_until_final(gate, clock, ids)
        # The gate still runs: a plain task after all of them completes.
        assert await gate.wait(await gate.submit("q"), timeout=GUARD) == b'"after"'
    for behaviour, task in zip(drawn, final, strict=True):
        assert (task.status, task.attempts, task.throttled) == behaviour.expected(), behaviour
        expected_runs = 1 if task.status is Status.COMPLETED else task.attempts + task.throttled
        assert (task.claims, runs[task.id], task.lease_lost) == (expected_runs, expected_runs, 0), behaviour
        if task.status is Status.FAILED:
            assert_readable(task.last_error)
            assert task.last_error
