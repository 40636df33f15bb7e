"""The raw-driver floor of each server: the fastest a minimal queue on the bare driver goes.

Per server, on a one-table queue of its own (in the run's isolated store):
- ``insert1``: one job per statement, each its own transaction (autocommit);
- ``idle_rt``: ms of one ``insert1`` plus one ``claim1`` after an idle pause drawn like the
  latency benchmark's gaps (median) -- the raw cost of a submit->start at low load, when the
  client, the server and the CPU have gone idle in between (much more than back to back);
- ``insert_batch``: 1,000 jobs per transaction (array insert / multi-row VALUES / RPUSH);
- ``claim1`` / ``claim100``: take 1 or 100 jobs per call (``SKIP LOCKED`` batch claim with
  psycopg / PyMySQL, ``LMOVE`` / 100 pipelined ``LMOVE`` with redis-py, an ``UPDATE …
  RETURNING`` write transaction with sqlite3);
- ``work10``: a minimal worker loop -- claim 10, then mark those 10 done in one statement.

All in jobs per second; each measurement stops after ``cap`` seconds (the rate is then that
of the jobs done so far). The memory backend has no floor.
"""

from __future__ import annotations

import random
import sqlite3
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

from benchmarks.stores import PG_HOST, PG_PORT, Store, mysql_connect

__all__ = ["FLOOR_NAMES", "SingleInserts", "measure_floors", "single_inserts"]

FLOOR_NAMES = ("insert1", "insert_batch", "claim1", "claim100", "work10", "idle_rt")
IDLE_SAMPLES = 15
BATCH = 1000


def measure_floors(store: Store, n: int, cap: float, idle_gap: tuple[float, float]) -> dict[str, float]:
    """Every floor of ``store``'s server, up to ``n`` jobs or ``cap`` seconds each; ``{}`` for memory.

    ``idle_gap``: the range of the pause before each ``idle_rt`` sample, in seconds.
    """
    floor = _floor_of(store)
    if floor is None:
        return {}
    try:
        return floor.measure(n, cap, idle_gap)
    finally:
        floor.close()


class SingleInserts(Protocol):
    """The ``insert1`` floor on its own: one raw job per autocommitted statement."""

    def insert_single(self, n: int) -> None:
        """Insert ``n`` jobs, one statement (and transaction) each."""

    def close(self) -> None:
        """Drop the connection."""


def single_inserts(store: Store) -> SingleInserts | None:
    """The raw floor's single inserts on ``store``'s server (its own table), None for memory."""
    return _floor_of(store)


def _floor_of(store: Store) -> _Floor | None:
    runner = {"postgresql": _PgFloor, "mariadb": _MySQLFloor, "redis": _RedisFloor, "sqlite": _SQLiteFloor}
    floor_class = runner.get(store.backend)
    return None if floor_class is None else floor_class(store)


def _rate(fn: Callable[[float], int]) -> float:
    """Jobs per second of ``fn(stop_time)``, which returns how many jobs it did."""
    start = time.perf_counter()
    return fn(start) / (time.perf_counter() - start)


class _Floor:
    """The shared measuring sequence; subclasses say how each step talks to their server."""

    def measure(self, n: int, cap: float, idle_gap: tuple[float, float]) -> dict[str, float]:
        out = {"insert1": _rate(lambda t0: self._insert_single(n, t0 + cap))}
        self.reset()
        out["idle_rt"] = self._idle_round_trips(idle_gap)
        self.reset()
        out["insert_batch"] = _rate(lambda t0: self._insert_batches(n, t0 + cap))
        for name, k, done in (("claim1", 1, False), ("claim100", 100, False), ("work10", 10, True)):
            self.reset()
            self.insert_batch(n)
            out[name] = _rate(lambda t0, k=k, done=done: self._drain(k, done, t0 + cap))
        return out

    def _insert_single(self, n: int, stop: float) -> int:
        done = 0
        while done < n and (done % 100 or time.perf_counter() < stop):
            self.insert_single(1)
            done += 1
        return done

    def _idle_round_trips(self, gap: tuple[float, float]) -> float:
        samples = []
        for _ in range(IDLE_SAMPLES):
            time.sleep(random.uniform(*gap))
            start = time.perf_counter()
            self.insert_single(1)
            if len(self.claim(1)) != 1:
                raise RuntimeError("the raw claim did not find the job just inserted")
            samples.append((time.perf_counter() - start) * 1000)
        return statistics.median(samples)

    def _insert_batches(self, n: int, stop: float) -> int:
        done = 0
        while done < n and time.perf_counter() < stop:
            self.insert_batch(min(BATCH, n - done))
            done += min(BATCH, n - done)
        return done

    def _drain(self, k: int, done: bool, stop: float) -> int:
        count = 0
        while time.perf_counter() < stop:
            ids = self.claim(k)
            if not ids:
                break
            if done:
                self.complete(ids)
            count += len(ids)
        return count

    def insert_single(self, n: int) -> None:
        raise NotImplementedError

    def insert_batch(self, n: int) -> None:
        raise NotImplementedError

    def claim(self, k: int) -> list[Any]:
        raise NotImplementedError

    def complete(self, ids: list[Any]) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _PgFloor(_Floor):
    def __init__(self, store: Store) -> None:
        import psycopg

        self.conn = psycopg.connect(
            host=PG_HOST, port=PG_PORT, user="postgres", dbname=store.spec["db"], autocommit=True
        )
        self.conn.execute(
            "CREATE TABLE floor_jobs (id bigserial PRIMARY KEY, queue text NOT NULL, "
            "status text NOT NULL, payload bytea, created_at timestamptz NOT NULL DEFAULT now())"
        )
        self.conn.execute("CREATE INDEX floor_jobs_claim ON floor_jobs (queue, id) WHERE status = 'pending'")

    def insert_single(self, n: int) -> None:
        sql = "INSERT INTO floor_jobs (queue, status, payload) VALUES ('q', 'pending', NULL)"
        for _ in range(n):
            self.conn.execute(sql)

    def insert_batch(self, n: int) -> None:
        sql = (
            "INSERT INTO floor_jobs (queue, status, payload) "
            "SELECT 'q', 'pending', p FROM unnest(%s::bytea[]) AS p"
        )
        for start in range(0, n, BATCH):
            self.conn.execute(sql, ([None] * min(BATCH, n - start),))

    def claim(self, k: int) -> list[Any]:
        sql = (
            "UPDATE floor_jobs SET status = 'running' WHERE id IN (SELECT id FROM floor_jobs "
            "WHERE queue = 'q' AND status = 'pending' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) "
            "RETURNING id"
        )
        return [row[0] for row in self.conn.execute(sql, (k,))]

    def complete(self, ids: list[Any]) -> None:
        self.conn.execute("UPDATE floor_jobs SET status = 'done' WHERE id = ANY(%s)", (ids,))

    def reset(self) -> None:
        self.conn.execute("TRUNCATE floor_jobs")

    def close(self) -> None:
        self.conn.close()


class _MySQLFloor(_Floor):
    def __init__(self, store: Store) -> None:
        self.conn = mysql_connect(store.spec["db"], autocommit=True)
        with self.conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            cur.execute(
                "CREATE TABLE floor_jobs (id BIGINT AUTO_INCREMENT PRIMARY KEY, queue VARCHAR(255) NOT NULL, "
                "status VARCHAR(16) NOT NULL, payload LONGBLOB, created_at DATETIME(6) NOT NULL "
                "DEFAULT CURRENT_TIMESTAMP(6), KEY floor_claim (queue, status, id)) ENGINE=InnoDB"
            )

    def insert_single(self, n: int) -> None:
        with self.conn.cursor() as cur:
            for _ in range(n):
                cur.execute("INSERT INTO floor_jobs (queue, status, payload) VALUES ('q', 'pending', NULL)")

    def insert_batch(self, n: int) -> None:
        sql = "INSERT INTO floor_jobs (queue, status, payload) VALUES (%s, %s, %s)"
        with self.conn.cursor() as cur:
            for start in range(0, n, BATCH):
                self.conn.begin()
                cur.executemany(sql, [("q", "pending", None)] * min(BATCH, n - start))
                self.conn.commit()

    def claim(self, k: int) -> list[Any]:
        with self.conn.cursor() as cur:
            self.conn.begin()
            cur.execute(
                "SELECT id FROM floor_jobs WHERE queue = 'q' AND status = 'pending' "
                "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                (k,),
            )
            ids = [row[0] for row in cur.fetchall()]
            if ids:
                cur.execute("UPDATE floor_jobs SET status = 'running' WHERE id IN %s", (ids,))
            self.conn.commit()
        return ids

    def complete(self, ids: list[Any]) -> None:
        with self.conn.cursor() as cur:
            cur.execute("UPDATE floor_jobs SET status = 'done' WHERE id IN %s", (ids,))

    def reset(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("TRUNCATE floor_jobs")

    def close(self) -> None:
        self.conn.close()


class _RedisFloor(_Floor):
    def __init__(self, store: Store) -> None:
        import redis

        self.client = redis.Redis.from_url(store.spec["url"])
        base = store.spec["key_prefix"]
        self.jobs, self.running = f"{base}floor:jobs", f"{base}floor:running"

    def insert_single(self, n: int) -> None:
        for i in range(n):
            self.client.lpush(self.jobs, i)

    def insert_batch(self, n: int) -> None:
        for start in range(0, n, BATCH):
            self.client.lpush(self.jobs, *range(start, min(n, start + BATCH)))

    def claim(self, k: int) -> list[Any]:
        if k == 1:
            job = self.client.lmove(self.jobs, self.running, "RIGHT", "LEFT")
            return [] if job is None else [job]
        pipe = self.client.pipeline(transaction=False)
        for _ in range(k):
            pipe.lmove(self.jobs, self.running, "RIGHT", "LEFT")
        return [job for job in pipe.execute() if job is not None]

    def complete(self, ids: list[Any]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for job in ids:
            pipe.lrem(self.running, 1, job)
        pipe.execute()

    def reset(self) -> None:
        self.client.delete(self.jobs, self.running)

    def close(self) -> None:
        self.reset()
        self.client.close()


class _SQLiteFloor(_Floor):
    def __init__(self, store: Store) -> None:
        path = store.spec["path"].replace("bench.db", "floor.db")
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # The broker's own settings (WAL, synchronous=NORMAL), so the comparison is fair.
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute(
            "CREATE TABLE floor_jobs (id INTEGER PRIMARY KEY, queue TEXT NOT NULL, status TEXT NOT NULL, "
            "payload BLOB, created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"
        )
        self.conn.execute("CREATE INDEX floor_claim ON floor_jobs (queue, id) WHERE status = 'pending'")

    def insert_single(self, n: int) -> None:
        for _ in range(n):
            self.conn.execute("INSERT INTO floor_jobs (queue, status, payload) VALUES ('q', 'pending', NULL)")

    def insert_batch(self, n: int) -> None:
        sql = "INSERT INTO floor_jobs (queue, status, payload) VALUES ('q', 'pending', ?)"
        for start in range(0, n, BATCH):
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(sql, [(None,)] * min(BATCH, n - start))
            self.conn.execute("COMMIT")

    def claim(self, k: int) -> list[Any]:
        self.conn.execute("BEGIN IMMEDIATE")
        rows = self.conn.execute(
            "UPDATE floor_jobs SET status = 'running' WHERE id IN (SELECT id FROM floor_jobs "
            "WHERE queue = 'q' AND status = 'pending' ORDER BY id LIMIT ?) RETURNING id",
            (k,),
        ).fetchall()
        self.conn.execute("COMMIT")
        return [row[0] for row in rows]

    def complete(self, ids: list[Any]) -> None:
        marks = ",".join("?" * len(ids))
        self.conn.execute(f"UPDATE floor_jobs SET status = 'done' WHERE id IN ({marks})", ids)

    def reset(self) -> None:
        self.conn.execute("DELETE FROM floor_jobs")

    def close(self) -> None:
        self.conn.close()
