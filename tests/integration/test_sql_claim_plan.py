"""PostgreSQL and MariaDB read a claim's tasks from the claim index in claim order (priority DESC,
run_at, id): no sort of the backlog, whatever its priorities. The statements are the ones a
claim runs, caught on their way to the driver, and EXPLAINed with their parameters."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event

from taskgate.brokers.base import NewTask
from taskgate.brokers.params import Claim, SharedLimits, Submit
from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.engine import normalize_url
from taskgate.ids import new_id

TTL = timedelta(seconds=30)


@pytest.fixture(params=["postgresql", "mysql"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    opened = create_engine(normalize_url(request.getfixturevalue(f"{request.param}_url")))
    yield opened
    opened.dispose()


def _backlog(broker: SQLBroker, engine: Engine) -> None:
    draw = random.Random(39)
    for _ in range(5):
        tasks = [
            NewTask(id=new_id(), type=draw.choice("ab"), queue=draw.choice("qr"), priority=draw.randrange(10))
            for _ in range(1000)
        ]
        broker.submit(Submit(tuple(tasks), snapshots=False))
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "ANALYZE TABLE taskgate_tasks" if engine.dialect.name == "mysql" else "ANALYZE taskgate_tasks"
        )


def _claim_statements(engine: Engine, claim: Any) -> list[tuple[str, Any]]:
    """The statements (and parameters) that read the due tasks of ``claim()``."""
    seen: list[tuple[str, Any]] = []

    def catch(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if "SKIP LOCKED" in statement and "ORDER BY" in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", catch)
    try:
        claim()
    finally:
        event.remove(engine, "before_cursor_execute", catch)
    return seen


def _plan(engine: Engine, statement: str, parameters: Any) -> str:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).fetchall()
        conn.rollback()
    return "\n".join(" | ".join(str(column) for column in row) for row in rows)


@pytest.mark.parametrize("how", ["plain", "types", "groups"])
def test_a_claim_reads_the_claim_index_in_order_without_a_sort(engine: Engine, how: str) -> None:
    broker = SQLBroker(engine)
    try:
        _backlog(broker, engine)
        options: dict[str, Any] = {"types": ("a",)} if how == "types" else {}
        if how == "groups":
            options["shared"] = SharedLimits(10, group_workers=1)
        statements = _claim_statements(engine, lambda: broker.claim(Claim("q", 10, TTL, **options)))
    finally:
        broker.close()
    assert statements, "no claim statement seen"
    for statement, parameters in statements:
        plan = _plan(engine, statement, parameters)
        assert "taskgate_tasks_claim" in plan, plan
        assert "Sort" not in plan and "filesort" not in plan and "temporary" not in plan, plan
