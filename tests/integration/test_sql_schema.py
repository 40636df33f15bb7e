"""Schema creation under races, table prefixes, and the query plans of the hot statements."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from gate_helpers import GUARD
from helpers.sql_databases import mysql_database
from sqlalchemy import create_engine, event, text

from taskgate.brokers.base import NewTask
from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.engine import normalize_url
from taskgate.clock import ManualClock
from taskgate.errors import ConfigError
from taskgate.models import SCHEMA_REVISION, TABLE_NAMES, build_models
from taskgate.testing import steps

CONSTRUCTORS = 6


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    fixture = "postgresql_url" if request.param == "postgresql" else "mysql_url"
    return str(request.getfixturevalue(fixture))


def test_brokers_created_at_once_on_a_fresh_database_all_succeed(empty_database: str) -> None:
    barrier = threading.Barrier(CONSTRUCTORS)
    errors: list[BaseException] = []
    brokers: list[SQLBroker] = []

    def construct() -> None:
        barrier.wait()
        try:
            broker = SQLBroker(empty_database)
            brokers.append(broker)
            broker.counts()  # the first call prepares the schema
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=construct) for _ in range(CONSTRUCTORS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    try:
        assert errors == []
        assert len(brokers) == CONSTRUCTORS
        engine = create_engine(normalize_url(empty_database))
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM taskgate_alembic_version")).all()
        engine.dispose()
        assert [v for (v,) in versions] == [SCHEMA_REVISION]
    finally:
        for broker in brokers:
            broker.close()


def test_mysql_a_second_broker_sees_the_schema_the_first_one_is_committing(mysql_url: str) -> None:
    """The schema lock is held until the creating transaction has committed. Released before
    the commit, a broker taking it next saw no version row yet, wrote it again and failed on
    the duplicate key once the first committed (a race of brokers starting at once)."""
    engine = create_engine(normalize_url(mysql_url))
    creator = threading.current_thread()
    stamped, committing, go_on = threading.Event(), threading.Event(), threading.Event()

    def note_stamp(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if threading.current_thread() is creator and statement.startswith(_STAMP):
            stamped.set()

    def hold_commit(conn: Any) -> None:
        if threading.current_thread() is creator and stamped.is_set() and not go_on.is_set():
            committing.set()
            assert go_on.wait(GUARD)

    event.listen(engine, "before_cursor_execute", note_stamp)
    event.listen(engine, "commit", hold_commit)
    second: list[SQLBroker | BaseException] = []

    def construct_second() -> None:
        assert committing.wait(GUARD)
        try:
            broker = SQLBroker(engine)
            broker.counts()  # the first call prepares the schema
            second.append(broker)
        except BaseException as exc:
            second.append(exc)

    other = threading.Thread(target=construct_second)
    other.start()
    releaser = threading.Thread(target=lambda: (_wait_for_the_second(mysql_url), go_on.set()))
    releaser.start()
    first = SQLBroker(engine)
    first.counts()  # its schema transaction's commit waits for the second to wait
    other.join(GUARD)
    releaser.join(GUARD)
    try:
        assert len(second) == 1 and isinstance(second[0], SQLBroker), second
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM taskgate_alembic_version")).all()
        assert [v for (v,) in versions] == [SCHEMA_REVISION]
    finally:
        first.close()
        for broker in second:
            if isinstance(broker, SQLBroker):
                broker.close()
        engine.dispose()


_STAMP = "INSERT INTO taskgate_alembic_version"


def _wait_for_the_second(url: str) -> None:
    """Until another session of the test's database waits for the schema lock (``User lock``)
    or sits in its own stamp of the version row (waiting for the first one's row)."""
    admin = create_engine(normalize_url(url), isolation_level="AUTOCOMMIT")
    query = text(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()"
        " AND ID <> CONNECTION_ID() AND (STATE = 'User lock' OR INFO LIKE :stamp)"
    )
    deadline = time.monotonic() + GUARD
    try:
        with admin.connect() as conn:
            while not conn.execute(query, {"stamp": f"{_STAMP}%"}).scalar():
                assert time.monotonic() < deadline, "the second broker never waited"
                time.sleep(0.005)  # another session's state: nothing to wait on but its row
    finally:
        admin.dispose()


@pytest.mark.parametrize("prefix", ["", "1tasks_", "task-gate_", "tg; DROP TABLE x", "a" * 32, "tg_ä"])
def test_a_table_prefix_that_is_not_a_short_identifier_is_refused(prefix: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="table_prefix must be an identifier"):
        SQLBroker(f"sqlite:///{tmp_path / 'x.db'}", table_prefix=prefix)
    assert not (tmp_path / "x.db").exists()


def test_every_name_fits_postgresql_and_mysql_limits_with_the_longest_prefix() -> None:
    models = build_models("p" * 31)
    names = [t.name for t in models.tables]
    names += [c.name for t in models.tables for c in t.constraints if isinstance(c.name, str)]
    names += [i.name for t in models.tables for i in t.indexes if isinstance(i.name, str)]

    assert {t.removeprefix("p" * 31) for t in [t.name for t in models.tables]} == set(TABLE_NAMES)
    assert max(len(name) for name in names) <= 63


def test_two_prefixes_keep_two_independent_stores(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'two.db'}"
    first, second = SQLBroker(url, table_prefix="a_"), SQLBroker(url, table_prefix="b_")
    try:
        steps.enqueue(first, [NewTask(id="x", type="t", queue="q")])
        assert steps.queue_length(second, "q") == 0
        assert steps.enqueue(second, [NewTask(id="x", type="t", queue="q")])[0].id == "x"
    finally:
        first.close()
        second.close()


def _statements(engine: Any) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        seen.append((statement, parameters))

    return seen


def _plan(engine: Any, statement: str, parameters: Any) -> str:
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        rows = conn.exec_driver_sql(f"EXPLAIN {statement}", parameters).all()
        conn.rollback()
    return "\n".join(row[0] for row in rows)


def test_claim_reap_counts_and_history_use_indexes_on_postgresql(postgresql_url: str) -> None:
    clock = ManualClock()
    engine = create_engine(normalize_url(postgresql_url))
    broker = SQLBroker(engine, clock=clock)
    try:
        steps.enqueue(
            broker, [NewTask(id=f"t{n:04d}", type=f"type{n % 7}", queue=f"q{n % 5}") for n in range(500)]
        )
        keyed = [NewTask(id=f"k{n}", type="keyed", queue="keyed", business_key=f"key-{n}") for n in range(5)]
        steps.enqueue(broker, keyed)
        for queue in ("q0", "q1", "q3", "q4"):
            steps.claim(broker, queue, 100, timedelta(seconds=30))
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
        seen = _statements(engine)
        steps.claim(broker, "q2", 5, timedelta(seconds=30))
        clock.advance(60)
        broker.reap(lease_lost_max=3, limit=10)
        broker.counts()
        steps.history(broker, "key-3")

        def plan_of(fragment: str) -> str:
            statement, parameters = next((s, p) for s, p in seen if fragment in s)
            return _plan(engine, statement, parameters)

        assert "ix_taskgate_tasks_claim" in plan_of("SKIP LOCKED")
        assert "ix_taskgate_leases_expires" in plan_of("taskgate_leases.expires_at <=")
        assert "ix_taskgate_tasks_type_status" in plan_of("GROUP BY")
        # Partial (rows with a key only), and a lookup by key still proves it applies.
        assert "ix_taskgate_tasks_business_key" in plan_of("taskgate_tasks.business_key =")
    finally:
        broker.close()
        engine.dispose()


def test_mysql_a_schema_being_made_holds_up_no_other_database_on_the_server(mysql_url: str) -> None:
    """MySQL's locks are the server's: one named after the prefix alone made every database's
    brokers wait while any one of them made its schema."""
    engine = create_engine(normalize_url(mysql_url))
    creator = threading.current_thread()
    committing, go_on = threading.Event(), threading.Event()

    def hold_commit(conn: Any) -> None:
        if threading.current_thread() is creator and not go_on.is_set():
            committing.set()
            assert go_on.wait(GUARD)

    event.listen(engine, "commit", hold_commit)
    other: list[SQLBroker | BaseException] = []

    def prepare_another_database(url: str) -> None:
        try:
            assert committing.wait(GUARD)  # the first holds its schema lock from here on
            broker = SQLBroker(url)
            broker.counts()  # the first call prepares the schema
            other.append(broker)
        except BaseException as exc:
            other.append(exc)
        finally:
            go_on.set()

    with mysql_database() as other_url:
        first = SQLBroker(engine)
        thread = threading.Thread(target=prepare_another_database, args=(other_url,))
        thread.start()
        try:
            first.counts()  # its schema transaction's commits wait until the other database is ready
            thread.join(GUARD)
            assert len(other) == 1 and isinstance(other[0], SQLBroker), other
            assert committing.is_set()
        finally:
            go_on.set()
            thread.join(GUARD)
            first.close()
            for broker in other:
                if isinstance(broker, SQLBroker):
                    broker.close()
            engine.dispose()
