"""`Gate.enqueue_in`: a task written in the application's own SQLAlchemy transaction.

Each SQL backend with the application's own engine on the broker's database, an ``orders``
table of its own, and a long poll everywhere: a worker in this process that starts the task
promptly was told by the commit, not by a poll.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from gate_helpers import GUARD, make_gate, until
from sqlalchemy import Engine, Integer, String, create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from taskgate import Config, ConfigError, Gate, QueueConfig, QueueFullError, Status, SyncClient, Task
from taskgate.brokers.memory import MemoryBroker
from taskgate.brokers.sql import SQLBroker
from taskgate.models import models_for
from taskgate.runtime import wakeups

LONG = 60.0  # every poll: far beyond GUARD, so only a wake-up can start a task in time
ASYNC_DRIVERS = {"postgresql+psycopg": "postgresql+psycopg", "mysql+pymysql": "mysql+asyncmy"}


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item: Mapped[str] = mapped_column(String(50))


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each SQL backend (a file for SQLite)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'app.db'}"
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def app_engine(url: str) -> Iterator[Engine]:
    """The application's own engine on the broker's database, with its own table."""
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


class Announced:
    """Records the queues a broker's `announce` was told about (the same-process wake-up)."""

    def __init__(self, broker: SQLBroker, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[str]] = []
        inner = broker.announce

        def announce(queues: Collection[str]) -> None:
            self.calls.append(sorted(queues))
            inner(queues)

        monkeypatch.setattr(broker, "announce", announce)


class Waiting:
    """Counts a broker's `wait_for_work` calls in progress (the wake-up loop's, in its thread)."""

    def __init__(self, broker: SQLBroker, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0
        lock, inner = threading.Lock(), broker.wait_for_work

        def wait_for_work(queues: Collection[str], timeout: float) -> bool:
            with lock:
                self.now += 1
            try:
                return inner(queues, timeout)
            finally:
                with lock:
                    self.now -= 1

        monkeypatch.setattr(broker, "wait_for_work", wait_for_work)


@pytest.fixture
def broker(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[SQLBroker]:
    """The gate's broker on the same database, its schema prepared, polling only every minute."""
    monkeypatch.setattr(wakeups, "WAIT_FOR_WORK_TIMEOUT", LONG)
    opened = SQLBroker(url, poll_interval=LONG)
    opened.counts()  # the schema, before any application transaction holds a lock
    yield opened
    opened.close()


def _stored(broker: SQLBroker) -> list[Task]:
    with SyncClient(_config_of(broker)) as client:
        return client.list()


def _config_of(broker: SQLBroker | MemoryBroker) -> Config:
    return Config(broker=broker, queues={"shipping": QueueConfig(workers=1)}, routes={"ship": "shipping"})


def _orders(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Order)).scalar_one())


def test_a_rolled_back_transaction_leaves_no_task_and_wakes_no_one(
    broker: SQLBroker, app_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    announced = Announced(broker, monkeypatch)
    gate = Gate(_config_of(broker))
    with Session(app_engine) as session:
        session.add(Order(item="book"))
        task_id = gate.enqueue_in(session, "ship", {"item": "book"})
        session.flush()
        assert [t.id for t in session.connection().execute(_tasks_query(broker)).all()] == [task_id]
        session.rollback()
    with app_engine.connect() as conn:
        conn.execute(_tasks_query(broker))  # still readable: the app's connection is fine
    assert _stored(broker) == [] and _orders(app_engine) == 0
    assert announced.calls == []


def _tasks_query(broker: SQLBroker) -> Any:
    return select(models_for("taskgate_").task.__table__.c.id)


@pytest.mark.anyio
@pytest.mark.parametrize("through", ["session", "connection"])
async def test_a_committed_task_runs_started_at_once_by_the_worker_in_this_process(
    broker: SQLBroker, app_engine: Engine, monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    announced, waiting = Announced(broker, monkeypatch), Waiting(broker, monkeypatch)
    ran: list[Any] = []
    started = anyio.Event()
    gate = make_gate(
        broker, {"shipping": QueueConfig(workers=1)}, routes={"ship": "shipping"}, poll_interval=LONG
    )

    @gate.handler("ship")
    async def ship(task: Task) -> None:
        ran.append(task.json())
        started.set()

    with anyio.fail_after(GUARD):
        async with gate:

            async def idle() -> bool:
                return waiting.now > 0

            await until(idle)  # the worker waits for news of work: only a wake-up comes in time
            if through == "session":
                with Session(app_engine) as session, session.begin():
                    session.add(Order(item="lamp"))
                    task_id = gate.enqueue_in(session, "ship", {"item": "lamp"}, business_key="order-1")
            else:
                with app_engine.begin() as conn:
                    conn.execute(Order.__table__.insert().values(item="lamp"))
                    task_id = gate.enqueue_in(conn, "ship", {"item": "lamp"}, business_key="order-1")
            await started.wait()
            assert await gate.wait(task_id, timeout=GUARD) is None
    assert ran == [{"item": "lamp"}] and announced.calls == [["shipping"]]
    assert _orders(app_engine) == 1
    assert [(t.id, t.business_key, t.status) for t in _stored(broker)] == [
        (task_id, "order-1", Status.COMPLETED)
    ]


def _async_url(url: str) -> str:
    if url.startswith("sqlite:"):
        return url.replace("sqlite:", "sqlite+aiosqlite:", 1)
    driver, rest = url.split("://", 1)
    return f"{ASYNC_DRIVERS[driver]}://{rest}"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # SQLAlchemy's asyncio extension
async def test_from_an_async_session_through_run_sync_commit_runs_it_and_rollback_drops_it(
    broker: SQLBroker, app_engine: Engine, url: str
) -> None:
    engine = create_async_engine(_async_url(url))
    gate = make_gate(broker, {"shipping": QueueConfig(workers=1)}, routes={"ship": "shipping"})
    gate.handle("ship", lambda task: task.json()["item"].upper())
    try:
        async with gate:
            async with AsyncSession(engine) as session:
                session.add(Order(item="dropped"))
                await session.run_sync(lambda s: gate.enqueue_in(s, "ship", {"item": "dropped"}))
                await session.rollback()
            async with AsyncSession(engine) as session, session.begin():
                session.add(Order(item="kept"))
                task_id = await session.run_sync(lambda s: gate.enqueue_in(s, "ship", {"item": "kept"}))
            assert await gate.wait_json(task_id, timeout=GUARD) == "KEPT"
            assert [t.id for t in await gate.list()] == [task_id]
    finally:
        await engine.dispose()
    assert _orders(app_engine) == 1


def test_a_sync_client_enqueues_in_the_transaction_too(broker: SQLBroker, app_engine: Engine) -> None:
    with SyncClient(_config_of(broker)) as client:
        with Session(app_engine) as session, session.begin():
            task_id = client.enqueue_in(session, "ship", {"item": "pen"}, delay="1h", priority=3)
        (task,) = client.list()
        assert (task.id, task.status, task.json()) == (task_id, Status.PENDING, {"item": "pen"})
        assert task.priority == 3


def test_a_full_queue_raises_queue_full_in_the_transaction_even_when_its_queue_blocks(
    broker: SQLBroker, app_engine: Engine
) -> None:
    config = Config(
        broker=broker,
        queues={"shipping": QueueConfig(workers=1, max_pending=1, on_full="block")},
        routes={"ship": "shipping"},
    )
    gate = Gate(config)
    with Session(app_engine) as session, session.begin():
        kept = gate.enqueue_in(session, "ship", {"item": "pen"})
    with Session(app_engine) as session, session.begin():
        session.add(Order(item="ink"))
        with pytest.raises(QueueFullError) as raised:
            gate.enqueue_in(session, "ship", {"item": "ink"})  # never waits in the app's transaction
        assert (raised.value.queue, raised.value.max_pending, raised.value.waiting) == ("shipping", 1, 1)
    # The application's transaction went on and committed its own row; no task was added.
    assert _orders(app_engine) == 1
    assert [t.id for t in _stored(broker)] == [kept]


def test_a_session_on_another_database_is_refused_and_nothing_is_written(
    broker: SQLBroker, tmp_path: Path
) -> None:
    other = create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    gate = Gate(_config_of(broker))
    with (
        Session(other) as session,
        pytest.raises(ConfigError, match=r"bound to sqlite:///.*other\.db, not to"),
    ):
        gate.enqueue_in(session, "ship", {"item": "x"})
    assert _stored(broker) == []
    other.dispose()


def test_bad_targets_and_options_are_refused_naming_them(broker: SQLBroker, app_engine: Engine) -> None:
    gate = Gate(_config_of(broker))
    with pytest.raises(TypeError, match="needs a SQLAlchemy Session or Connection in a transaction, got str"):
        gate.enqueue_in("session", "ship")
    with pytest.raises(TypeError, match=r"from an AsyncSession, call it through run_sync"):
        gate.enqueue_in(AsyncSession(), "ship")
    with Session(app_engine) as session:
        with pytest.raises(TypeError, match="unexpected keyword argument 'dely'"):
            gate.enqueue_in(session, "ship", dely="1h")
        with pytest.raises(ValueError, match="max_retry"):
            gate.enqueue_in(session, "ship", max_retry=-1)
        with pytest.raises(TypeError, match="priority"):
            gate.enqueue_in(session, "ship", priority="high")
        session.commit()
    assert _stored(broker) == []


def test_a_broker_that_is_not_sql_is_refused(app_engine: Engine) -> None:
    gate = Gate(_config_of(MemoryBroker()))
    with (
        Session(app_engine) as session,
        pytest.raises(ConfigError, match=r"enqueue_in .* needs a SQL broker \(SQLBroker\); MemoryBroker"),
    ):
        gate.enqueue_in(session, "ship")


def _notified_before_a_marker(listener: Any, marker_from: Engine) -> list[str]:
    """The queues notified on taskgate's channel before a marker sent after them (PostgreSQL
    delivers notifications in commit order, so the marker's arrival means all before it came)."""
    with marker_from.begin() as conn:
        conn.execute(select(func.pg_notify("taskgate_work", "--marker--")))
    seen: list[str] = []
    for note in listener.notifies(timeout=GUARD):
        if note.payload == "--marker--":
            return seen
        seen.append(note.payload)
    raise AssertionError(f"the marker never came; saw {seen}")


def test_postgresql_notifies_other_processes_in_the_transaction_only_if_it_commits(
    postgresql_url: str,
) -> None:
    import psycopg

    engine = create_engine(postgresql_url)
    Base.metadata.create_all(engine)
    broker = SQLBroker(postgresql_url, poll_interval=LONG)
    gate = Gate(_config_of(broker))
    listener = psycopg.connect(postgresql_url.replace("postgresql+psycopg", "postgresql"), autocommit=True)
    try:
        listener.execute('LISTEN "taskgate_work"')  # as another process's broker does
        with Session(engine) as session:
            gate.enqueue_in(session, "ship", {"item": "gone"})
            session.rollback()
        assert _notified_before_a_marker(listener, engine) == []
        with Session(engine) as session, session.begin():
            gate.enqueue_in(session, "ship", {"item": "kept"})
        assert _notified_before_a_marker(listener, engine) == ["shipping"]
    finally:
        listener.close()
        broker.close()
        engine.dispose()
