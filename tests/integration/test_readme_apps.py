"""The README's "Sync code" and "Enqueue in your transaction" blocks run as written."""

from __future__ import annotations

from pathlib import Path

from anyio.from_thread import start_blocking_portal
from helpers.readme import readme_block
from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import taskgate
from taskgate import Config, Gate, QueueConfig, Status, SyncClient
from taskgate.brokers.memory import MemoryBroker
from taskgate.brokers.sql import SQLBroker


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(50))


def test_the_sync_code_block_submits_and_waits_from_a_plain_thread() -> None:
    config = Config(broker=MemoryBroker(), queues={"cpu": QueueConfig(workers=1)}, routes={"retrieve": "cpu"})
    worker = Gate(config, poll_interval=0.01)
    worker.handle("retrieve", lambda task: {"docs": [task.json()["q"]]})
    scope = {"taskgate": taskgate, "config": config}
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(worker):
        exec(readme_block("**Sync code**"), scope)
    scope["client"].close()
    assert scope["answer"] == {"docs": ["..."]}


def test_the_enqueue_block_commits_the_order_and_its_task_together(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    broker = SQLBroker(url)
    config = Config(broker=broker, queues={"q": QueueConfig(workers=1)}, routes={"ship": "q"})
    with SyncClient(config) as client:
        client.overview()  # the broker makes its tables before the transaction writes (SQLite)
        scope = {"Session": Session, "engine": engine, "order": Order(item="lamp"), "gate": Gate(config)}
        exec(readme_block("**Enqueue in your transaction.**"), scope)
        (task,) = client.list()
    assert (task.type, task.status, task.json()) == ("ship", Status.PENDING, {"order": 1})
    with Session(engine) as session:
        assert [order.item for order in session.query(Order)] == ["lamp"]
    broker.close()
    engine.dispose()
