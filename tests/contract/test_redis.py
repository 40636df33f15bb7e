"""The broker contract suite on the shared Redis, isolated by a random key prefix per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from helpers.redis_servers import purge_keys

from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.clock import ManualClock
from taskgate.testing import BrokerContract, BrokerFactory


class TestRedisBroker(BrokerContract):
    """Every contract test against a real Redis; each test's keys are deleted afterwards."""

    @pytest.fixture
    def broker_factory(
        self, clock: ManualClock, redis_url: str, unique_prefix: str
    ) -> Iterator[BrokerFactory]:
        opened: list[RedisBroker] = []

        def open_broker() -> RedisBroker:
            broker = RedisBroker(redis_url, key_prefix=unique_prefix, clock=clock)
            opened.append(broker)
            return broker

        yield open_broker
        for broker in opened:
            broker.close()
        cleanup = redis.Redis.from_url(redis_url)
        try:
            purge_keys(cleanup, KeySpace(unique_prefix).pattern())
        finally:
            cleanup.close()
