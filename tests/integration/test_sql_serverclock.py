"""The sampled server clock: the server's time, read every few seconds, never running backwards."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, func, select

from taskgate.brokers.sql.dialects import traits_for
from taskgate.brokers.sql.engine import normalize_url
from taskgate.brokers.sql.serverclock import SampledServerClock


@pytest.fixture(params=["postgresql", "mysql"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    url = str(request.getfixturevalue(f"{request.param}_url"))
    engine = create_engine(normalize_url(url))
    yield engine
    engine.dispose()


class Statements:
    """Counts the statements an engine sends."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *_: Any) -> None:
        self.count += 1


def _server_time(conn: Connection, dialect: str) -> datetime:
    if dialect == "postgresql":
        value = conn.execute(select(func.clock_timestamp())).scalar_one()
    else:
        value = conn.execute(select(func.utc_timestamp(6))).scalar_one()
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def test_reads_the_server_once_then_carries_its_time_forward(engine: Engine) -> None:
    clock = SampledServerClock(traits_for(engine.dialect.name), resync=3600)
    statements = Statements(engine)
    with engine.connect() as conn:
        first = clock.now(conn)
        assert statements.count == 1
        times = [clock.now(conn) for _ in range(50)]
        assert statements.count == 1  # no round trip after the first reading
        server = _server_time(conn, engine.dialect.name)
    assert first.tzinfo is UTC and all(t.tzinfo is UTC for t in times)
    assert times == sorted(times) and first <= times[0]
    # The carried-forward time tracks the server's own within a generous margin.
    assert abs(server - clock.now(conn)) < timedelta(milliseconds=250)


def test_reads_again_after_the_resync_interval_and_never_goes_backwards(engine: Engine) -> None:
    clock = SampledServerClock(traits_for(engine.dialect.name), resync=0)
    statements = Statements(engine)
    with engine.connect() as conn:
        times = [clock.now(conn) for _ in range(20)]
    assert statements.count == 20  # resync=0: every call reads the server
    assert times == sorted(times)


def test_a_transaction_that_waited_still_gets_the_current_time(engine: Engine) -> None:
    """PostgreSQL's now() is frozen at the transaction's start; the clock must not be."""
    clock = SampledServerClock(traits_for(engine.dialect.name), resync=0)
    with engine.begin() as conn:
        start = clock.now(conn)
        conn.execute(select(func.pg_sleep(0.05) if engine.dialect.name == "postgresql" else func.sleep(0.05)))
        later = clock.now(conn)
    assert later - start >= timedelta(milliseconds=45)
