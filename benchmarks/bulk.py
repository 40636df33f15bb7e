"""Filling a store fast with finished tasks, at the SQL / Redis level (set-up, not measured).

The rows are what the brokers themselves would hold for completed no-op tasks of queue
``noop`` (same columns, indexes, counters), written by one ``INSERT … SELECT`` over a number
series per chunk (``generate_series`` / MariaDB's ``seq_1_to_N`` / a recursive CTE) or by
pipelined ``HSET``/``ZADD`` on Redis. Filling stops early when a time budget runs out; the
caller reports the size actually reached.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Boolean, bindparam, create_engine, text

from benchmarks.common import LEASE, QUEUE
from benchmarks.stores import Store
from taskgate.brokers.base import NewTask
from taskgate.brokers.params import Claim, Complete, Settle, Submit
from taskgate.ids import new_id
from taskgate.models import models_for
from taskgate.models.types import UTCDateTime

__all__ = ["fill_finished"]

CHUNK = 50_000
REDIS_CHUNK = 10_000
_FILL_LUA = Path(__file__).with_name("fill_finished.lua")
_COLUMNS = (
    "id, type, queue, status, ready, run_at, created_at, started_at, finished_at, payload, result, "
    "last_error, attempts, max_retry, throttled, lease_lost, claims, ignore_parent_failure, depends_on, "
    "business_key, replay_of"
)
_VALUES = (
    "'noop', 'noop', 'completed', :no, :t, :t, :t, :t, NULL, NULL, NULL, 0, 0, 0, 0, 1, :no, '[]', NULL, NULL"
)


def fill_finished(store: Store, m: int, budget: float) -> int:
    """Add up to ``m`` completed tasks to ``store`` within ``budget`` seconds; return how many."""
    if store.backend == "memory":
        return _fill_memory(store, m, budget)
    if store.backend == "redis":
        return _fill_redis(store, m, budget)
    return _fill_sql(store, m, budget)


def _chunks(m: int, budget: float, size: int = CHUNK) -> Iterator[tuple[int, int]]:
    """(first, last) number ranges of ``size`` until ``m`` or the budget is reached."""
    deadline = time.perf_counter() + budget
    for lo in range(1, m + 1, size):
        if time.perf_counter() > deadline:
            return
        yield lo, min(m, lo + size - 1)


def _sql_statement(dialect: str, table: str, lo: int, hi: int) -> str:
    if dialect == "postgresql":
        return (
            f"INSERT INTO {table} ({_COLUMNS}) SELECT 'F' || lpad(g::text, 12, '0'), {_VALUES} "
            f"FROM generate_series({lo}, {hi}) AS g"
        )
    if dialect in ("mysql", "mariadb"):
        return (
            f"INSERT INTO {table} ({_COLUMNS}) SELECT CONCAT('F', LPAD(seq, 12, '0')), {_VALUES} "
            f"FROM seq_{lo}_to_{hi}"
        )
    return (
        f"WITH RECURSIVE g(x) AS (SELECT {lo} UNION ALL SELECT x + 1 FROM g WHERE x < {hi}) "
        f"INSERT INTO {table} ({_COLUMNS}) SELECT 'F' || printf('%012d', x), {_VALUES} FROM g"
    )


def _fill_sql(store: Store, m: int, budget: float) -> int:
    from taskgate.brokers.sql.engine import make_engine

    store.open().counts()  # its first call creates the tables
    table = models_for("taskgate_").task.__table__.name  # type: ignore[attr-defined]
    engine = make_engine(store.url) if store.backend == "sqlite" else create_engine(store.url)
    when = datetime.now(UTC) - timedelta(hours=1)
    params = [bindparam("t", when, type_=UTCDateTime()), bindparam("no", False, type_=Boolean())]
    done = 0
    try:
        for lo, hi in _chunks(m, budget):
            with engine.begin() as conn:
                conn.execute(text(_sql_statement(engine.dialect.name, table, lo, hi)).bindparams(*params))
            done = hi
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(text(f"ANALYZE {table}"))
            elif engine.dialect.name in ("mysql", "mariadb"):
                conn.execute(text(f"ANALYZE TABLE {table}"))
    finally:
        engine.dispose()
    return done


def _fill_redis(store: Store, m: int, budget: float) -> int:
    import redis

    from taskgate.brokers.redis.keys import KeySpace

    base = KeySpace(store.spec["key_prefix"]).base
    client = redis.Redis.from_url(store.url)
    fill = client.register_script(_FILL_LUA.read_text())
    at = int((time.time() - 3600) * 1_000_000)
    done = 0
    try:
        # Small chunks: one script blocks the (shared) server for its whole run.
        for lo, hi in _chunks(m, budget, REDIS_CHUNK):
            fill(keys=[base], args=[lo, hi, at, QUEUE])
            done = hi
    finally:
        client.close()
    return done


def _fill_memory(store: Store, m: int, budget: float) -> int:
    """The memory broker has no lower level: submit, claim and settle through its own verbs."""
    broker = store.open()
    done = 0
    gc.disable()  # a million long-lived objects: full collections would dominate the set-up
    try:
        for lo, hi in _chunks(m, budget):
            tasks = tuple(NewTask(id=new_id(), type=QUEUE, queue=QUEUE) for _ in range(hi - lo + 1))
            broker.submit(Submit(tasks, snapshots=False))
            leases = broker.claim(Claim(QUEUE, len(tasks), LEASE)).leases
            acks = tuple(Complete(lease.task.id, lease.token) for lease in leases)
            broker.settle(Settle(acks, snapshots=False))
            done = hi
    finally:
        gc.enable()
    return done
