"""The contract suite on a broker declared outside taskgate: what a third party's test file needs.

`CountingBroker` stands for a third party's broker (here a `MemoryBroker` counting the calls
it answers); passing `BrokerContract` takes a subclass and a ``broker_factory`` fixture.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from taskgate.brokers.base import Capabilities
from taskgate.brokers.memory import MemoryBroker
from taskgate.brokers.params import Claim, Claimed, ItemAnswer, Settle
from taskgate.testing import BrokerContract, BrokerFactory, ManualClock


class CountingBroker(MemoryBroker):
    """A memory broker that counts its claims and settles."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.calls: Counter[str] = Counter()

    def claim(self, claim: Claim) -> Claimed:
        self.calls["claim"] += 1
        return super().claim(claim)

    def settle(self, settle: Settle) -> list[ItemAnswer]:
        self.calls["settle"] += 1
        return super().settle(settle)


class TestCountingBroker(BrokerContract):
    @pytest.fixture
    def broker_factory(self, clock: ManualClock) -> Iterator[BrokerFactory]:
        broker = CountingBroker(clock)  # in one process the broker is its store: one object serves
        yield lambda: broker
        broker.close()


class LimitedBroker(MemoryBroker):
    """A third party's broker that shares quota but neither slots nor rates: the contract holds
    it to refusing `Claim.shared`, a slot heartbeat and slots given back."""

    capabilities = Capabilities(shared_quota=True, nonblocking=True)


class TestLimitedBroker(BrokerContract):
    @pytest.fixture
    def broker_factory(self, clock: ManualClock) -> Iterator[BrokerFactory]:
        broker = LimitedBroker(clock=clock)
        yield lambda: broker
        broker.close()


class UngroupedBroker(MemoryBroker):
    """A third party's broker that shares slots and rates but cannot count groups."""

    capabilities = Capabilities(shared_quota=True, shared_limits=True, nonblocking=True)


class TestUngroupedBroker(BrokerContract):
    @pytest.fixture
    def broker_factory(self, clock: ManualClock) -> Iterator[BrokerFactory]:
        broker = UngroupedBroker(clock=clock)
        yield lambda: broker
        broker.close()
