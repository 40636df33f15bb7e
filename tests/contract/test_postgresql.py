"""The broker contract suite on `SQLBroker` over a real PostgreSQL.

One database per module (created once, tables emptied between tests) keeps the suite fast;
see `helpers.sql_databases`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.sql_databases import (
    POSTGRES_HOST,
    POSTGRES_PORT,
    empty_tables,
    make_tables,
    postgresql_database,
    require_postgresql,
    sql_brokers,
)

from taskgate.clock import ManualClock
from taskgate.testing import BrokerContract, BrokerFactory


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """One PostgreSQL database for the module, with taskgate's tables."""
    require_postgresql()
    with postgresql_database(POSTGRES_HOST, POSTGRES_PORT) as url:
        make_tables(url)
        yield url


class TestPostgreSQLBroker(BrokerContract):
    """Every contract test on PostgreSQL; each broker object has its own pool (and listener)."""

    @pytest.fixture
    def broker_factory(self, clock: ManualClock, database_url: str) -> Iterator[BrokerFactory]:
        with sql_brokers(database_url, clock) as open_broker:
            yield open_broker
        empty_tables(database_url)
