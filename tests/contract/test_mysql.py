"""The broker contract suite on `SQLBroker` over a real MariaDB/MySQL.

One database per module (created once, tables emptied between tests) keeps the suite fast;
see `helpers.sql_databases`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.sql_databases import (
    MYSQL_URL,
    empty_tables,
    make_tables,
    mysql_database,
    require_mysql,
    sql_brokers,
)

from taskgate.clock import ManualClock
from taskgate.testing import BrokerContract, BrokerFactory


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """One MariaDB/MySQL database for the module, with taskgate's tables."""
    require_mysql()
    with mysql_database(MYSQL_URL) as url:
        make_tables(url)
        yield url


class TestMySQLBroker(BrokerContract):
    """Every contract test on MariaDB/MySQL; each broker object has its own pool."""

    @pytest.fixture
    def broker_factory(self, clock: ManualClock, database_url: str) -> Iterator[BrokerFactory]:
        with sql_brokers(database_url, clock) as open_broker:
            yield open_broker
        empty_tables(database_url)
