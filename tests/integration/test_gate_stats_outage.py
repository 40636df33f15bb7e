"""`Gate.stats` while a real store is down: the last figures, marked unreachable, within a bound.

The shared servers are never stopped: each test starts a private one (`helpers.redis_servers`,
`helpers.pg_servers`), reads stats once, then stops or freezes it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
from gate_helpers import GUARD, until
from helpers.pg_servers import PostgresServer, postgres_binaries
from helpers.redis_servers import RedisServer, have_redis_server

from taskgate import Config, Gate, ManualClock, QueueConfig, QueueStats
from taskgate.brokers.base import Broker, QuotaSpec
from taskgate.brokers.params import Claim
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.sql import SQLBroker

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

SOCKET_TIMEOUT = 0.5
SLACK = 1.0  # for process scheduling on a busy CI machine
POLL = 0.02
# lease_ttl 2 s: a worker call's deadline (lease_ttl/4) is 0.5 s.
QUEUES = {"q": QueueConfig(workers=1, lease_ttl="2s", quota_limit=5, quota_period="24h")}
BUDGET = QuotaSpec("q", 5, timedelta(hours=24))


def _require(found: bool, what: str) -> None:
    if not found:
        message = f"{what} not installed: cannot start a private server"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server that persists every write, so a restart finds the figures again."""
    _require(have_redis_server(), "redis-server")
    private = RedisServer(tmp_path / "redis", appendonly=True).start()
    yield private
    private.stop()


@pytest.fixture
def pg_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL server."""
    _require(postgres_binaries() is not None, "initdb/postgres")
    private = PostgresServer()
    try:
        yield private.start()
    finally:
        private.stop()


async def _spent(gate: Gate, broker: Broker, units: int) -> QueueStats:
    """Submit tasks to queue "q", take ``units`` of its budget by claiming them, then read stats."""
    await gate.submit_many("q", [None] * (units + 1))
    assert len(broker.claim(Claim("q", units, timedelta(minutes=5), quota=BUDGET)).leases) == units
    stats = await gate.stats("q")
    assert (stats.queue_len, stats.quota_used, stats.reachable) == (1, units, True)
    return stats


async def _reachable(gate: Gate) -> bool:
    return (await gate.stats("q")).reachable


async def _stalled(gate: Gate) -> bool:
    return (await gate.stats("q")).quota_stalled


async def test_stats_of_a_stopped_redis_are_the_last_figures_marked_unreachable(
    redis_server: RedisServer,
) -> None:
    broker = RedisBroker(redis_server.url, socket_timeout=SOCKET_TIMEOUT, clock=ManualClock())
    gate = Gate(Config(broker=broker, queues=QUEUES), poll_interval=POLL)
    try:
        last = await _spent(gate, broker, 2)
        redis_server.stop()
        with anyio.fail_after(SOCKET_TIMEOUT + SLACK):
            assert await gate.stats("q") == dataclasses.replace(last, reachable=False)
        redis_server.start()  # same port and data: the store answers again
        await until(lambda: _reachable(gate))
        assert await gate.stats("q") == last
    finally:
        broker.close()


async def test_stats_show_a_worker_stalled_by_a_stopped_redis(redis_server: RedisServer) -> None:
    broker = RedisBroker(redis_server.url, socket_timeout=SOCKET_TIMEOUT, clock=ManualClock())
    gate = Gate(Config(broker=broker, queues=QUEUES), poll_interval=POLL)
    gate.handle("q", lambda task: None)
    try:
        async with gate:
            await gate.wait(await gate.submit("q"), timeout=GUARD)
            last = await gate.stats("q")
            redis_server.stop()  # the worker's next quota claim finds no store: it stalls
            await until(lambda: _stalled(gate))
            assert await gate.stats("q") == dataclasses.replace(last, reachable=False, quota_stalled=True)
            redis_server.start()
            await until(lambda: _reachable(gate))
            await gate.wait(await gate.submit("q"), timeout=GUARD)  # a claim answered: not stalled
            assert not (await gate.stats("q")).quota_stalled
    finally:
        broker.close()


async def test_stats_of_a_frozen_redis_give_up_within_a_worker_calls_deadline(
    redis_server: RedisServer,
) -> None:
    # The socket would wait GUARD seconds: only the stats call's own deadline (0.5 s) ends it.
    broker = RedisBroker(redis_server.url, socket_timeout=GUARD, clock=ManualClock())
    gate = Gate(Config(broker=broker, queues=QUEUES), poll_interval=POLL)
    assert redis_server.process is not None
    try:
        last = await _spent(gate, broker, 1)
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        try:
            with anyio.fail_after(0.5 + SLACK):
                assert await gate.stats("q") == dataclasses.replace(last, reachable=False)
        finally:
            os.kill(redis_server.process.pid, signal.SIGCONT)
        await until(lambda: _reachable(gate))
    finally:
        broker.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_stats_of_a_stopped_postgresql_are_the_last_figures_marked_unreachable(
    pg_server: PostgresServer,
) -> None:
    broker = SQLBroker(pg_server.url, clock=ManualClock())
    gate = Gate(Config(broker=broker, queues=QUEUES), poll_interval=POLL)
    try:
        last = await _spent(gate, broker, 2)
        pg_server.crash()  # stopped at once, its data kept for the start below
        with anyio.fail_after(0.5 + SLACK):
            assert await gate.stats("q") == dataclasses.replace(last, reachable=False)
        pg_server.start()
        await until(lambda: _reachable(gate))
        assert await gate.stats("q") == last
    finally:
        broker.close()
