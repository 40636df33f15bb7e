"""Fixtures of every contract test: ``clock``, ``broker_factory`` (from the backend) and ``broker``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from taskgate.brokers.base import Broker
from taskgate.clock import ManualClock

__all__ = ["START", "BrokerFactory", "ContractFixtures"]

BrokerFactory = Callable[[], Broker]

# Midnight UTC: aligned to every quota period a test uses, so windows start at START.
START = datetime(2030, 1, 1, tzinfo=UTC)


class ContractFixtures:
    """Fixtures of `BrokerContract`; a backend overrides ``broker_factory`` only."""

    @pytest.fixture
    def clock(self) -> ManualClock:
        """The test's clock: every broker the factory opens must read time from it."""
        return ManualClock(START)

    @pytest.fixture
    def broker_factory(self) -> BrokerFactory:
        """Each call opens a NEW broker object on the test's ONE store, using ``clock``."""
        pytest.fail(
            "a BrokerContract subclass must define a `broker_factory(self, clock)` fixture",
            pytrace=False,
        )

    @pytest.fixture
    def broker(self, broker_factory: BrokerFactory) -> Broker:
        """The test's main broker (the factory's first)."""
        return broker_factory()
