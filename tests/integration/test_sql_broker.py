"""SQLBroker behaviour beyond the contract: URLs, engines, clocks, wake-ups, limits, errors."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers.sql_databases import make_tables
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.types import UserDefinedType

from taskgate.brokers import open_broker
from taskgate.brokers.base import NewTask
from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.dialects import SQLiteTraits
from taskgate.brokers.sql.engine import normalize_url
from taskgate.brokers.sql.pg_copy import _binary_types, copy_rows
from taskgate.brokers.sql.retry import ATTEMPTS, run_with_retries
from taskgate.clock import ManualClock
from taskgate.errors import BrokerError
from taskgate.task import Status, Task
from taskgate.testing import steps


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    fixture = "postgresql_url" if request.param == "postgresql" else "mysql_url"
    return str(request.getfixturevalue(fixture))


@pytest.mark.parametrize(
    ("given", "driver"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgres://u@h/db", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg"),
        ("mysql://u@h/db", "mysql+pymysql"),
        ("mariadb://u@h/db", "mariadb+pymysql"),
        ("sqlite:///x.db", "sqlite"),
    ],
)
def test_plain_urls_get_the_tested_drivers(given: str, driver: str) -> None:
    assert normalize_url(given).drivername == driver


def test_mysql_urls_default_to_utf8mb4() -> None:
    assert normalize_url("mysql://u@h/db").query["charset"] == "utf8mb4"


def test_open_broker_opens_a_sql_broker(tmp_path: Path) -> None:
    broker = open_broker(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        assert isinstance(broker, SQLBroker)
    finally:
        broker.close()


def test_capabilities_declare_push_wakeups_only_on_postgresql(url: str) -> None:
    broker = SQLBroker(url)
    try:
        caps = broker.capabilities
        assert (caps.shared_quota, caps.cross_process) == (True, True)
        assert caps.push_wakeups is url.startswith("postgresql")
    finally:
        broker.close()


def test_without_a_clock_times_come_from_the_database_server(url: str) -> None:
    broker = SQLBroker(url)
    try:
        before = datetime.now(UTC)
        (task,) = steps.enqueue(broker, [NewTask(id="a", type="t", queue="q")])
        hour = timedelta(hours=1)
        grant = steps.claim_within_quota(broker, "q", 1, hour, key="k", quota_limit=10, period=hour).quota
        assert task.created_at.tzinfo is UTC
        assert abs(task.created_at - before) < timedelta(seconds=5)  # same host in tests
        assert grant is not None
        assert grant.window_start == task.created_at.replace(minute=0, second=0, microsecond=0)
    finally:
        broker.close()


def test_times_keep_microseconds(url: str) -> None:
    run_at = datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
    broker = SQLBroker(url)
    try:
        steps.enqueue(broker, [NewTask(id="a", type="t", queue="q", run_at=run_at)])
        assert broker.get("a").run_at == run_at
    finally:
        broker.close()


def test_a_shared_engine_stays_open_after_close(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    make_tables(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM taskgate_tasks")).scalar() == 0
    engine.dispose()


def test_an_in_memory_sqlite_broker_serves_many_threads() -> None:
    broker = SQLBroker("sqlite://")
    try:
        threads = [
            threading.Thread(target=steps.enqueue, args=(broker, [NewTask(id=f"t{n}", type="t", queue="q")]))
            for n in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert steps.queue_length(broker, "q") == 8
        assert broker.capabilities.cross_process is False
    finally:
        broker.close()


def test_an_unreachable_server_raises_broker_error_with_the_driver_error_chained() -> None:
    broker = SQLBroker("postgresql://postgres@127.0.0.1:1/nothing")
    with pytest.raises(BrokerError) as caught:
        broker.get("a")
    assert caught.value.__cause__ is not None
    broker.close()


def test_a_closed_broker_refuses_calls(tmp_path: Path) -> None:
    broker = SQLBroker(f"sqlite:///{tmp_path / 'x.db'}")
    broker.close()
    broker.close()
    with pytest.raises(BrokerError, match="closed"):
        broker.get("a")
    assert broker.wait_for_work(["q"], 0) is False


def test_postgresql_wakes_a_waiter_by_notify_long_before_its_poll(postgresql_url: str) -> None:
    waiter = SQLBroker(postgresql_url, poll_interval=30)
    submitter = SQLBroker(postgresql_url)
    try:
        waiter.wait_for_work(["q"], 0.5)  # starts the listener; nothing is due
        result: list[bool] = []
        thread = threading.Thread(target=lambda: result.append(waiter.wait_for_work(["q"], 20)))
        started = time.monotonic()
        thread.start()
        time.sleep(0.2)  # let the waiter block (ordering, not timing: any delay works)
        steps.enqueue(submitter, [NewTask(id="a", type="t", queue="q")])
        thread.join(20)
        assert result == [True]
        assert time.monotonic() - started < 10  # woken by NOTIFY, not by the 30 s poll
    finally:
        waiter.close()
        submitter.close()


def test_mysql_refuses_a_payload_larger_than_max_allowed_packet(mysql_url: str) -> None:
    broker = SQLBroker(mysql_url)
    try:
        engine = create_engine(normalize_url(mysql_url))
        with engine.connect() as conn:
            packet = int(conn.execute(text("SELECT @@max_allowed_packet")).scalar_one())
        engine.dispose()
        with pytest.raises(ValueError, match="max_allowed_packet"):
            steps.enqueue(broker, [NewTask(id="big", type="t", queue="q", payload=b"x" * packet)])
        assert broker.counts() == {}
    finally:
        broker.close()


def test_mysql_ids_are_case_sensitive(mysql_url: str) -> None:
    broker = SQLBroker(mysql_url)
    try:
        steps.enqueue(broker, [NewTask(id="a", type="t", queue="q"), NewTask(id="A", type="t", queue="q")])
        assert broker.counts() == {"t": {Status.PENDING: 2}}
    finally:
        broker.close()


def _busy() -> OperationalError:
    import sqlite3

    error = sqlite3.OperationalError("database is locked")
    error.sqlite_errorcode = sqlite3.SQLITE_BUSY
    return OperationalError("BEGIN IMMEDIATE", {}, error)


def test_the_retry_helper_reruns_a_transaction_that_lost_a_lock_race() -> None:
    calls: list[int] = []

    def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _busy()
        return "done"

    assert run_with_retries(attempt, SQLiteTraits().is_retryable, sleep=lambda _: None) == "done"
    assert len(calls) == 3


def test_the_retry_helper_gives_up_after_a_bounded_number_of_attempts() -> None:
    calls: list[int] = []

    def attempt() -> str:
        calls.append(1)
        raise _busy()

    with pytest.raises(OperationalError):
        run_with_retries(attempt, SQLiteTraits().is_retryable, sleep=lambda _: None)
    assert len(calls) == ATTEMPTS


def test_the_retry_helper_does_not_rerun_other_errors() -> None:
    calls: list[int] = []

    def attempt() -> str:
        calls.append(1)
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        run_with_retries(attempt, SQLiteTraits().is_retryable, sleep=lambda _: None)
    assert len(calls) == 1


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_ack_batches_of_any_size_send_the_same_statements(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Lists go as one parameter (json_each / ANY): no statement is re-rendered per batch size."""
    url = (
        f"sqlite:///{tmp_path / 'tasks.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgresql_url")
    )
    broker = SQLBroker(url)
    sent: list[str] = []
    try:
        steps.enqueue(broker, [NewTask(id="parent", type="t", queue="q")])
        (parent,) = steps.claim(broker, "q", 1, timedelta(seconds=30))
        steps.enqueue(broker, [NewTask(id="child", type="t", queue="q", depends_on=("parent",))])
        event.listen(broker._engine, "before_cursor_execute", lambda _c, _cur, sql, *_: sent.append(sql))
        by_size: dict[int, set[str]] = {}
        for size in (2, 7):
            steps.enqueue(broker, [NewTask(id=f"t{size}-{n}", type="t", queue="q") for n in range(size)])
            items = [
                (lease.task.id, lease.token, None)
                for lease in steps.claim(broker, "q", size, timedelta(seconds=30))
            ]
            if size == 7:
                items.append((parent.task.id, parent.token, None))  # and settle a child too
            sent.clear()
            answers = steps.ack_many(broker, items)
            by_size[size] = set(sent)
            statuses = [answer.status if isinstance(answer, Task) else answer for answer in answers]
            assert statuses == [Status.COMPLETED] * len(items)
        assert by_size[2] <= by_size[7]
        assert broker.get("child").status is Status.PENDING  # found through the list of parents
    finally:
        broker.close()


def _stored_rows(broker: SQLBroker, ids: list[str]) -> list[tuple[object, ...]]:
    """The task rows of ``ids`` as stored, in order, without the id (compared across batches)."""
    task = broker._models.task.__table__
    with broker._engine.connect() as conn:
        rows = {row.id: tuple(row)[1:] for row in conn.execute(task.select().where(task.c.id.in_(ids)))}
    return [rows[task_id] for task_id in ids]


def _varied_tasks(prefix: str) -> list[NewTask]:
    """20 tasks whose every column varies: payload bytes that need escaping, keys, parents, times."""
    payloads = [None, b"", b"\x00\\\n\t'\"", "é✓".encode(), b"x" * 5000]
    return [
        NewTask(
            id=f"{prefix}{n}",
            type="t",
            queue="q",
            payload=payloads[n % len(payloads)],
            business_key=f"{prefix}-clé-{n}" if n % 3 else None,
            depends_on=("parent",) if n % 2 else (),
            run_at=datetime(2031, 5, 6, 7, 8, 9, n, tzinfo=UTC) if n % 4 == 0 else None,
            max_retry=n,
            ignore_parent_failure=n % 5 == 0,
        )
        for n in range(20)
    ]


def test_a_postgresql_batch_copied_in_binary_is_stored_as_inserted_rows_are(postgresql_url: str) -> None:
    broker = SQLBroker(postgresql_url, clock=ManualClock(datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)))
    try:
        steps.enqueue(broker, [NewTask(id="parent", type="t", queue="q")])
        copied, inserted = _varied_tasks("c"), _varied_tasks("i")
        snapshots = steps.enqueue(broker, copied)  # 20 rows: COPY
        for task in inserted:
            steps.enqueue(broker, [task])  # one row: INSERT
        table = broker._models.task.__table__
        assert _binary_types(table, tuple(table.c.keys())) is not None  # the batch went in binary
        keys = list(table.c.keys()).index("business_key") - 1  # without id
        for mine, theirs in zip(
            _stored_rows(broker, [t.id for t in copied]),
            _stored_rows(broker, [t.id for t in inserted]),
            strict=True,
        ):
            assert (mine[keys] or "c").replace("c", "i", 1) == (theirs[keys] or "i")
            assert mine[:keys] + mine[keys + 1 :] == theirs[:keys] + theirs[keys + 1 :]
        assert [broker.get(t.id) for t in copied] == snapshots
        assert [t.payload for t in snapshots] == [t.payload for t in copied]
        assert [t.id for t in steps.history(broker, "c-clé-1")] == ["c1"]  # the key rows were copied too
        assert broker.get("c1").status is Status.BLOCKED  # and the edges
    finally:
        broker.close()


def test_a_column_of_a_type_psycopg_does_not_know_by_name_is_copied_as_text(postgresql_url: str) -> None:
    class Label(UserDefinedType[str]):
        cache_ok = True

        def get_col_spec(self, **_: object) -> str:
            return "label"

    engine = create_engine(normalize_url(postgresql_url))
    table = Table("labelled", MetaData(), Column("id", Integer, primary_key=True), Column("name", Label()))
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE DOMAIN label AS text CHECK (VALUE <> '')"))
            table.create(conn)
            assert _binary_types(table, ("id", "name")) is None
            copy_rows(conn, table, [{"id": n, "name": f"n{n}"} for n in range(20)])
            assert conn.execute(text("SELECT count(*), min(name) FROM labelled")).one() == (20, "n0")
    finally:
        engine.dispose()


def test_rows_of_one_column_are_copied(postgresql_url: str) -> None:
    engine = create_engine(normalize_url(postgresql_url))
    table = Table("single", MetaData(), Column("id", Integer, primary_key=True))
    try:
        with engine.begin() as conn:
            table.create(conn)
            copy_rows(conn, table, [{"id": n} for n in range(20)])
            assert conn.execute(text("SELECT count(*), sum(id) FROM single")).one() == (20, 190)
    finally:
        engine.dispose()
