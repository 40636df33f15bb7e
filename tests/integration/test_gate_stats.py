"""`Gate.stats`: the backlog and the quota window read from the store, by any process, and the
last figures -- marked unreachable, never an error -- while the store does not answer."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from gate_helpers import GUARD, Faulty, make_gate, until

from taskgate import BrokerError, ConfigError, Gate, ManualClock, QueueConfig, QueueStats
from taskgate.brokers.base import Broker, Capabilities, QuotaSpec
from taskgate.brokers.memory import MemoryBroker
from taskgate.brokers.params import Claim, QueueQuery, QueueState
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.sql import SQLBroker  # type: ignore[attr-defined]

pytestmark = pytest.mark.anyio

HOUR = timedelta(hours=1)
START = datetime(2030, 1, 1, tzinfo=UTC)  # where the tests' ManualClock starts: a window's start
METERED = {"metered": QueueConfig(workers=2, quota_limit=3, quota_period="1h")}


@pytest.fixture
def reader(
    backend: str, broker: Broker, request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path
) -> Iterator[Broker]:
    """A second broker on ``broker``'s store, as a web process would open it (memory: the same
    one, a memory broker being its own store), on the test's clock like the first."""
    if backend == "memory":
        yield broker
        return
    if backend == "sqlite":
        opened: Broker = SQLBroker(f"sqlite:///{tmp_path / 'gate.db'}", clock=clock)
    elif backend == "redis":
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("unique_prefix")
        opened = RedisBroker(url, key_prefix=prefix, clock=clock)
    else:
        opened = SQLBroker(request.getfixturevalue(f"{backend}_url"), clock=clock)
    yield opened
    opened.close()


async def _used(gate: Gate, queue: str, units: int) -> bool:
    return (await gate.stats(queue)).quota_used == units


async def test_a_gate_running_no_workers_reads_the_quota_a_worker_gate_spent(
    broker: Broker, reader: Broker, clock: ManualClock
) -> None:
    worker = make_gate(broker, METERED)
    worker.handle("metered", lambda task: None)
    web = make_gate(reader, METERED)  # never started: no scheduler, nothing counted in memory
    before = await web.stats("metered")
    assert (before.quota_limit, before.quota_used, before.quota_exhausted) == (3, 0, False)
    assert before.quota_window_end == START + HOUR
    async with worker:
        await worker.submit_many("metered", [None] * 5)
        await until(lambda: _used(web, "metered", 3))
        spent = await web.stats("metered")
        assert spent == QueueStats(
            workers=2,
            running=0,  # the handlers ran in the worker gate, not here
            queue_len=2,
            rps=0.0,
            quota_exhausted=True,  # from the store's figures alone
            quota_stalled=False,
            quota_limit=3,
            quota_used=3,
            quota_window_end=START + HOUR,
            reachable=True,
        )
        clock.advance(HOUR)
        await until(lambda: _used(web, "metered", 2))  # the next window: the two left ran
        after = await web.stats("metered")
    assert (after.queue_len, after.quota_exhausted, after.quota_window_end) == (0, False, START + 2 * HOUR)


# -- the store not answering ------------------------------------------------------------------

DOWN = BrokerError("store down")
BUDGET = {"q": QueueConfig(workers=1, quota_limit=5, quota_period="1h")}


def _spend(broker: Broker, units: int) -> None:
    """Take ``units`` of queue "q"'s budget (its key is the queue's name) by claiming tasks."""
    claimed = broker.claim(Claim("q", units, HOUR, quota=QuotaSpec("q", 5, HOUR)))
    assert len(claimed.leases) == units


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "taskgate" and r.levelno >= logging.WARNING]


async def test_stats_while_the_store_fails_are_the_last_figures_marked_unreachable(
    gate_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    broker = Faulty(gate_broker)
    gate = make_gate(broker, BUDGET)
    await gate.submit_many("q", [1, 2, 3])
    _spend(gate_broker, 2)
    last = await gate.stats("q")
    assert (last.queue_len, last.quota_used, last.reachable) == (1, 2, True)
    broker.failing["queue_state"] = DOWN
    _spend(gate_broker, 1)  # what the store holds moves on; this process cannot know
    with caplog.at_level(logging.DEBUG, logger="taskgate"):
        for _ in range(3):
            assert await gate.stats("q") == dataclasses.replace(last, reachable=False)
    assert len(_warnings(caplog)) == 1  # once per outage; the repeats at DEBUG
    del broker.failing["queue_state"]
    again = await gate.stats("q")
    assert (again.queue_len, again.quota_used, again.reachable) == (0, 3, True)


async def test_stats_before_the_store_ever_answered_are_zeros_marked_unreachable(gate_broker: Broker) -> None:
    broker = Faulty(gate_broker)
    broker.failing["queue_state"] = DOWN
    gate = make_gate(broker, BUDGET)
    assert await gate.stats("q") == QueueStats(
        workers=1, running=0, queue_len=0, rps=0.0, quota_limit=5, reachable=False
    )


async def test_stats_still_refuse_a_bad_or_unknown_queue_while_the_store_fails(gate_broker: Broker) -> None:
    broker = Faulty(gate_broker)
    broker.failing["queue_state"] = DOWN
    gate = make_gate(broker, BUDGET)
    with pytest.raises(ConfigError, match="unknown queue"):
        await gate.stats("nowhere")
    with pytest.raises(ValueError, match="queue"):
        await gate.stats("")


async def test_a_worker_stalled_on_the_store_shows_quota_stalled_with_the_last_figures(
    gate_broker: Broker,
) -> None:
    broker = Faulty(gate_broker)
    gate = make_gate(broker, BUDGET)
    gate.handle("q", lambda task: None)
    async with gate:
        last = await gate.stats("q")
        broker.failing["queue_state"] = broker.failing["claim.quota"] = DOWN
        await gate.submit("q")
        await until(lambda: _stalled(gate))
        stats = await gate.stats("q")
        assert (stats.reachable, stats.queue_len, stats.quota_used) == (False, last.queue_len, 0)
        broker.failing.clear()
        await until(lambda: _used(gate, "q", 1))
        assert not (await gate.stats("q")).quota_stalled


async def _stalled(gate: Gate) -> bool:
    return (await gate.stats("q")).quota_stalled


class _Unanswered:
    """A broker whose `queue_state` does not answer until `answer` is set (a half-open
    connection), called in threads like a server broker."""

    capabilities = Capabilities(shared_quota=True)

    def __init__(self, inner: Broker) -> None:
        self._inner = inner
        self.answer = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def queue_state(self, query: QueueQuery) -> QueueState:
        self.answer.wait(GUARD)
        return self._inner.queue_state(query)


async def test_stats_give_up_on_a_store_that_does_not_answer_within_a_worker_calls_deadline() -> None:
    broker = _Unanswered(MemoryBroker())
    # A worker call's deadline is lease_ttl/4: 0.25 s here, far below the stuck call's GUARD.
    gate = make_gate(broker, {"q": QueueConfig(workers=1, lease_ttl="1s", quota_limit=5, quota_period="1h")})
    broker.answer.set()
    await gate.submit("q")
    last = await gate.stats("q")
    broker.answer.clear()
    try:
        with anyio.fail_after(GUARD / 4):
            assert await gate.stats("q") == dataclasses.replace(last, reachable=False)
    finally:
        broker.answer.set()
    assert (await gate.stats("q")).reachable
