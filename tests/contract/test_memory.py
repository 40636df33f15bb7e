"""The broker contract suite on `MemoryBroker`: one broker object is the whole store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from taskgate.brokers.base import Broker
from taskgate.brokers.memory import MemoryBroker
from taskgate.clock import ManualClock
from taskgate.testing import BrokerContract, BrokerFactory


class TestMemoryBroker(BrokerContract):
    @pytest.fixture
    def broker_factory(self, clock: ManualClock) -> Iterator[BrokerFactory]:
        # A memory broker IS its store, so every "connection" is the same object.
        broker = MemoryBroker(clock=clock)

        def open_broker() -> Broker:
            return broker

        yield open_broker
        broker.close()
