"""The broker contract suite on `SQLBroker` over a SQLite file (one fresh file per test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.sql_databases import sql_brokers

from taskgate.clock import ManualClock
from taskgate.testing import BrokerContract
from taskgate.testing.contract import BrokerFactory


class TestSQLiteBroker(BrokerContract):
    """Every contract test on a SQLite file; each broker object opens its own engine."""

    @pytest.fixture
    def broker_factory(self, clock: ManualClock, tmp_path: Path) -> Iterator[BrokerFactory]:
        with sql_brokers(f"sqlite:///{tmp_path / 'tasks.db'}", clock) as open_broker:
            yield open_broker
