"""The broker contract suite on `SQLBroker` over a SQLite file (one fresh file per test).

Twice: called directly (as a sync app or a worker thread calls it), and called the way `Gate`
calls it, first on the event loop without waiting (`taskgate.brokers.nowait`) and again when
that answers `WouldBlock` -- the races then mix both paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.inline_first import AttemptedInline
from helpers.sql_databases import sql_brokers

from taskgate.clock import ManualClock
from taskgate.testing import BrokerContract, BrokerFactory, new_task, steps
from taskgate.testing.contract._support import TTL


class TestSQLiteBroker(BrokerContract):
    """Every contract test on a SQLite file; each broker object opens its own engine."""

    @pytest.fixture
    def broker_factory(self, clock: ManualClock, tmp_path: Path) -> Iterator[BrokerFactory]:
        with sql_brokers(f"sqlite:///{tmp_path / 'tasks.db'}", clock) as open_broker:
            yield open_broker


class TestSQLiteBrokerAttemptedInline(BrokerContract):
    """Every contract test again, each call attempted without waiting first."""

    @pytest.fixture
    def broker_factory(self, clock: ManualClock, tmp_path: Path) -> Iterator[BrokerFactory]:
        with sql_brokers(f"sqlite:///{tmp_path / 'tasks.db'}", clock) as open_broker:
            yield lambda: AttemptedInline(open_broker())

    def test_a_worker_s_transitions_are_answered_by_the_first_attempt(self, broker_factory: Any) -> None:
        broker = broker_factory()
        steps.enqueue(broker, [new_task(queue="q")])  # the first call prepares the schema, in a thread
        (lease,) = steps.claim(broker, "q", 10, TTL)
        steps.ack_many(broker, [(lease.task.id, lease.token, None)])
        broker.get(lease.task.id)
        assert (broker.inline, broker.moved) == (3, 1)
