"""SQLite transitions attempted on the event loop: they never wait there, and change nothing
when they would have to (`taskgate.brokers.nowait`)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
from gate_helpers import GUARD, eventually, make_gate

from taskgate import Status, Task
from taskgate.brokers import nowait
from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.broker import INLINE_MAX_ROWS
from taskgate.brokers.sql.engine import SQLITE_BUSY_TIMEOUT
from taskgate.task import Filter
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, new_task


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "tasks.db"


@pytest.fixture
def broker(path: Path) -> Iterator[SQLBroker]:
    opened = SQLBroker(f"sqlite:///{path}")
    opened.counts()  # the first call, which prepares the schema, is never attempted inline
    yield opened
    opened.close()


class OtherProcessWriting:
    """Another connection to the file holding its write lock, as another process would."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def __enter__(self) -> OtherProcessWriting:
        self._conn.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")


def _attempt(call: Callable[[], object]) -> BaseException | None:
    """Run ``call`` under `nowait.no_wait` in a thread; what it raised, or None.

    In a thread so that an attempt which waits after all (on a lock, on busy_timeout) fails the
    test at the guard instead of hanging it.
    """
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            with nowait.no_wait():
                call()
        except BaseException as exc:
            raised.append(exc)
        else:
            raised.append(None)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(SQLITE_BUSY_TIMEOUT / 2)  # an attempt on busy_timeout would still be waiting
    assert raised, "the attempt waited instead of answering at once"
    return raised[0]


def _busy_timeouts(broker: SQLBroker) -> set[int]:
    """busy_timeout (ms) of every connection the broker's pool holds."""
    pool = broker._engine.pool
    held = [pool.connect() for _ in range(pool.checkedin())]
    try:
        return {conn.driver_connection.execute("PRAGMA busy_timeout").fetchone()[0] for conn in held}
    finally:
        for conn in held:
            conn.close()


def test_small_transitions_run_under_no_wait(broker):
    with nowait.no_wait():
        (stored,) = steps.enqueue(broker, [new_task(queue="q")])
        (lease,) = steps.claim(broker, "q", INLINE_MAX_ROWS, TTL)
        (done,) = steps.ack_many(broker, [(lease.task.id, lease.token, b"ok")])
        again = broker.get(stored.id)
    assert lease.task.id == stored.id
    assert isinstance(done, Task) and done.status is Status.COMPLETED and again.result == b"ok"


def test_a_write_while_another_process_holds_the_file_answers_would_block_and_changes_nothing(broker, path):
    (pending,) = steps.enqueue(broker, [new_task(queue="q")])
    with OtherProcessWriting(path):
        assert isinstance(_attempt(lambda: steps.claim(broker, "q", 1, TTL)), nowait.WouldBlock)
        assert isinstance(_attempt(lambda: steps.enqueue(broker, [new_task(queue="q")])), nowait.WouldBlock)
    assert broker.get(pending.id).status is Status.PENDING
    assert steps.queue_length(broker, "q") == 1
    # The attempt's busy_timeout of 0 was the connection's only for that BEGIN.
    assert _busy_timeouts(broker) == {int(SQLITE_BUSY_TIMEOUT * 1000)}


def test_a_write_of_another_thread_of_this_process_answers_would_block(broker):
    (pending,) = steps.enqueue(broker, [new_task(queue="q")])
    assert broker._writers is not None
    with broker._writers:  # a worker thread's transition holding this process's writer turn
        assert isinstance(_attempt(lambda: steps.claim(broker, "q", 1, TTL)), nowait.WouldBlock)
        assert _attempt(lambda: broker.get(pending.id)) is None  # reads take no turn
    assert steps.claim(broker, "q", 1, TTL)[0].task.id == pending.id


def test_transitions_that_may_take_long_are_never_attempted(broker):
    too_many = [new_task(queue="q") for _ in range(INLINE_MAX_ROWS + 1)]
    refused = {
        "enqueue of a big batch": lambda: steps.enqueue(broker, too_many),
        "claim of a big batch": lambda: steps.claim(broker, "q", INLINE_MAX_ROWS + 1, TTL),
        "quota claim of a big batch": lambda: steps.claim_within_quota(
            broker, "q", INLINE_MAX_ROWS + 1, TTL, key="k", quota_limit=5, period=timedelta(hours=1)
        ),
        "list": lambda: broker.list(Filter()),
        "counts": broker.counts,
        "queue_state": lambda: steps.queue_length(broker, "q"),
        "reap": lambda: broker.reap(lease_lost_max=3),
        "wait_for_work": lambda: broker.wait_for_work(["q"], 0.0),
    }
    for what, call in refused.items():
        with nowait.no_wait(), pytest.raises(nowait.WouldBlock):
            call()
            pytest.fail(f"{what} ran under no_wait")
    assert broker.counts() == {}
    steps.enqueue(broker, [new_task(queue="q") for _ in range(5)])
    whole = steps.claim_within_quota(broker, "q", 5, TTL, key="k", quota_limit=5, period=timedelta(hours=1))
    assert len(whole.leases) == 5  # no unit was taken


@pytest.mark.anyio
async def test_a_gate_waits_in_a_thread_for_another_process_s_write_lock(broker, path):
    gate = make_gate(broker)
    gate.handle("q", lambda task: "done")
    async with gate:
        submitted: list[str] = []

        async def submit() -> None:
            submitted.append(await gate.submit("q"))

        with OtherProcessWriting(path) as other:
            async with anyio.create_task_group() as tg:
                tg.start_soon(submit)
                # The submit's first attempt found the file locked: it now waits in a thread.
                with anyio.fail_after(GUARD):
                    await anyio.wait_all_tasks_blocked()
                assert submitted == []
                other.release()
        (task_id,) = submitted
        assert (await eventually(gate, task_id, lambda t: t.status.is_final)).result == b'"done"'
