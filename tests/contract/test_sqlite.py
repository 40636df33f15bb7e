"""The broker contract suite on `SQLBroker` over a SQLite file (one fresh file per test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from taskgate.brokers.sql import SQLBroker
from taskgate.clock import ManualClock
from taskgate.testing import BrokerContract
from taskgate.testing.contract import BrokerFactory


class TestSQLiteBroker(BrokerContract):
    """Every contract test on a SQLite file; each broker object opens its own engine."""

    @pytest.fixture
    def broker_factory(self, clock: ManualClock, tmp_path: Path) -> Iterator[BrokerFactory]:
        url = f"sqlite:///{tmp_path / 'tasks.db'}"
        opened: list[SQLBroker] = []

        def open_broker() -> SQLBroker:
            broker = SQLBroker(url, clock=clock, poll_interval=0.02)
            opened.append(broker)
            return broker

        yield open_broker
        for broker in opened:
            broker.close()
