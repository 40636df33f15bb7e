"""PostgreSQL calls split in two (`taskgate.brokers.sql.pg_split`): the statement leaves from the
event loop on the held connection and the loop reads its reply. They answer what the same calls
answer in a thread, send nothing when they cannot finish on the loop, go back to the thread path
on any error the server answers, and a caller that gives up leaves the reply to a thread."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest
from gate_helpers import GUARD, make_gate
from helpers.split_calls import CountsSplits, LateLeases, drive
from psycopg.types.string import TextLoader
from sqlalchemy import create_engine, event, text

from taskgate import QueueConfig, Status, Task
from taskgate.brokers import nowait
from taskgate.brokers.base import Lease, NewTask, QuotaSpec
from taskgate.brokers.params import Claim, Claimed, Complete, Hold, SharedLimits, Submit
from taskgate.brokers.split import MAX_SPLIT_REQUEST
from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql import engine as engine_module
from taskgate.brokers.sql.engine import normalize_url
from taskgate.brokers.sql.held import HeldConnection
from taskgate.brokers.sql.serverclock import RESYNC_SECONDS
from taskgate.errors import BrokerError, TaskNotFoundError
from taskgate.runtime.calls import BrokerCalls
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, new_task


class CountingSplits(CountsSplits, SQLBroker):
    """A SQLBroker that counts the calls it split and those it left to a thread."""


@pytest.fixture
def broker(postgresql_url: str) -> Iterator[CountingSplits]:
    opened = CountingSplits(postgresql_url)
    yield opened
    opened.close()


def _held(broker: SQLBroker) -> HeldConnection:
    held = broker._held
    assert held is not None and not held.transactions  # in autocommit, for one-statement calls
    return held


def _ready(broker: SQLBroker) -> None:
    """A call in a thread opens the held connection and reads the server's clock, which a split
    call can do neither of (it sends nothing until both are there)."""
    assert broker.split(broker.get, "warm-up") is None
    steps.claim(broker, "warm-up", 1, TTL)


def _split(broker: SQLBroker, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    call = broker.split(method, *args, **kwargs)
    assert call is not None, "the call was not split"
    return drive(call)


def _quiet(*tasks: NewTask) -> Submit:
    """A submit as the runtime sends it: statuses only."""
    return Submit(tasks, snapshots=False)


def _claim(queue: str, limit: int, quota: QuotaSpec | None = None) -> Claim:
    return Claim(queue, limit, TTL, quota=quota)


def _session(broker: SQLBroker) -> int:
    with _held(broker).use() as conn:
        return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


# -- the broker's side -----------------------------------------------------------------------


def test_split_calls_answer_as_their_methods_do(broker: CountingSplits) -> None:
    _ready(broker)
    task = new_task(payload=b"\x00\xffpayload")
    quiet = _split(broker, broker.submit, _quiet(task))
    assert (quiet.statuses, quiet.tasks) == ([Status.PENDING], [])
    assert broker.get(task.id).payload == b"\x00\xffpayload"

    keyed = new_task(business_key="order-7", delay=timedelta(hours=1))
    submitted = _split(broker, broker.submit, Submit((keyed,)))
    (stored,) = submitted.tasks
    assert submitted.statuses == [Status.PENDING] and stored == broker.get(stored.id)
    assert stored.business_key == "order-7" and stored.run_at > stored.created_at

    (child,) = _split(broker, broker.submit, Submit((new_task(depends_on=(task.id,)),))).tasks
    assert child.status is Status.BLOCKED and child == broker.get(child.id)

    claimed = _split(broker, broker.claim, _claim("q", 5))
    assert isinstance(claimed, Claimed) and (claimed.acked, claimed.quota) == ([], None)
    (lease,) = claimed.leases
    assert isinstance(lease, Lease)
    assert lease.task.id == task.id and lease.task.status is Status.RUNNING
    assert lease.task == broker.get(task.id)
    steps.ack(broker, task.id, lease.token, b"done")  # the token the split claim answered holds the lease
    assert broker.get(child.id).status is Status.PENDING
    assert broker.split_names == ["submit", "submit", "submit", "claim"]


def test_a_claim_of_some_types_is_split_as_one_statement_and_leases_only_those(
    broker: CountingSplits,
) -> None:
    _ready(broker)
    steps.enqueue(broker, [new_task(type="new") for _ in range(50)])
    mine = [new_task(type="old"), new_task(type="older")]
    steps.enqueue(broker, mine)
    typed = Claim("q", 5, TTL, types=("old", "older"))
    leased = _split(broker, broker.claim, typed).leases
    assert [lease.task.id for lease in leased] == sorted(t.id for t in mine)
    quota = QuotaSpec("typed", 10, timedelta(hours=1))
    broker.claim(Claim("q", 1, TTL, quota=quota, types=("new",)))  # opens the window in a thread
    within = _split(broker, broker.claim, Claim("q", 5, TTL, quota=quota, types=("new",)))
    assert len(within.leases) == 5 and within.quota is not None and within.quota.granted == 5
    assert broker.split_names == ["claim", "claim"]


def test_neither_a_claim_carrying_acks_nor_one_with_shared_limits_is_split(
    broker: CountingSplits,
) -> None:
    _ready(broker)
    steps.enqueue(broker, [new_task(), new_task()])
    (lease,) = steps.claim(broker, "q", 1, TTL)
    carrying = Claim("q", 1, TTL, acks=(Complete(lease.task.id, lease.token),))
    assert broker.split(broker.claim, carrying) is None  # acks and claim are one transaction
    # So are the shared limits and the claim.
    assert broker.split(broker.claim, Claim("q", 1, TTL, shared=SharedLimits(workers=2))) is None
    assert broker.counts() == {"t": {Status.RUNNING: 1, Status.PENDING: 1}}  # nothing sent
    assert len(_split(broker, broker.claim, _claim("q", 1)).leases) == 1  # the connection went back
    assert broker.split_names == ["claim"]


def test_a_split_claim_within_quota_never_over_issues_its_window(broker: CountingSplits) -> None:
    _ready(broker)
    steps.enqueue(broker, [new_task() for _ in range(4)])
    quota = QuotaSpec("ocr", 3, timedelta(hours=1))
    unopened = broker.split(broker.claim, _claim("q", 1, quota))
    assert unopened is not None
    with pytest.raises(nowait.WouldBlock):  # no window row yet: the thread path opens it
        drive(unopened)
    assert broker.counts() == {"t": {Status.PENDING: 4}}  # the statement changed nothing
    assert len(broker.claim(_claim("q", 1, quota)).leases) == 1

    call = broker.split(broker.claim, _claim("q", 4, quota))
    assert call is not None
    taken = drive(call)
    assert len(taken.leases) == 2 and not taken.exhausted  # (units were left when it claimed)
    assert taken.quota is not None
    assert (taken.quota.key, taken.quota.granted, taken.quota.limit) == ("ocr", 2, 3)
    assert broker.counts() == {"t": {Status.RUNNING: 3, Status.PENDING: 1}}
    assert steps.ack(broker, taken.leases[0].task.id, taken.leases[0].token, None).status is Status.COMPLETED
    spent = _split(broker, broker.claim, _claim("q", 1, quota))
    assert spent.leases == [] and spent.exhausted


def test_a_split_claim_of_a_held_queue_leases_nothing_and_answers_its_hold(broker: CountingSplits) -> None:
    _ready(broker)
    steps.enqueue(broker, [new_task() for _ in range(2)])
    quota = QuotaSpec("ocr", 3, timedelta(hours=1))
    assert len(broker.claim(_claim("q", 1, quota)).leases) == 1  # opens the window row
    until = broker.hold(Hold("q", for_=timedelta(minutes=5)))
    assert until is not None
    plain = _split(broker, broker.claim, _claim("q", 5))
    within_quota = _split(broker, broker.claim, _claim("q", 5, quota))
    assert (plain.leases, plain.held_until) == ([], until)
    assert (within_quota.leases, within_quota.held_until) == ([], until)
    assert within_quota.quota is not None and within_quota.quota.granted == 0
    assert broker.hold(Hold("q", resume=True)) is None
    resumed = _split(broker, broker.claim, _claim("q", 5))
    assert (len(resumed.leases), resumed.held_until) == (1, None)
    assert broker.split_names == ["claim", "claim", "claim"]


def test_a_split_get_answers_every_field_as_the_thread_path_reads_it(broker: CountingSplits) -> None:
    _ready(broker)
    (parent,) = steps.enqueue(broker, [new_task()])
    (task,) = steps.enqueue(
        broker,
        [
            new_task(
                payload=bytes(range(256)),
                business_key="k-1",
                depends_on=(parent.id,),
                ignore_parent_failure=True,
                max_retry=3,
            )
        ],
    )
    for task_id in (parent.id, task.id):
        assert _split(broker, broker.get, task_id) == broker.get(task_id)
    missing = broker.split(broker.get, "no-such-task")
    assert missing is not None
    with pytest.raises(TaskNotFoundError, match="no-such-task"):
        drive(missing)


def test_a_taken_id_sends_the_call_to_the_thread_path_having_changed_nothing(broker: CountingSplits) -> None:
    _ready(broker)
    task = new_task()
    steps.enqueue(broker, [task])
    call = broker.split(broker.submit, _quiet(new_task(id=task.id, queue="other")))
    assert call is not None
    with pytest.raises(nowait.WouldBlock):
        drive(call)
    assert broker.counts() == {"t": {Status.PENDING: 1}}
    with pytest.raises(ValueError, match="already in use"):
        broker.submit(_quiet(new_task(id=task.id, queue="other")))  # the thread path names it
    assert _split(broker, broker.get, task.id).queue == "q"  # the connection went back


def test_bad_arguments_raise_before_anything_is_sent(broker: CountingSplits) -> None:
    _ready(broker)
    with pytest.raises(ValueError, match="task id"):
        broker.split(broker.get, "")
    with pytest.raises(ValueError, match=r"claim limit"):
        broker.split(broker.claim, Claim("q", 0, TTL))
    assert _split(broker, broker.claim, _claim("q", 1)).leases == []  # the held connection was given back


class OverridesGet(SQLBroker):
    def get(self, task_id: str) -> Task:
        return super().get(task_id)


def test_what_is_not_split_sends_nothing(broker: CountingSplits, postgresql_url: str) -> None:
    _ready(broker)
    assert broker.split(broker.submit, _quiet(new_task(), new_task())) is None  # a batch
    big = new_task(payload=b"x" * (MAX_SPLIT_REQUEST + 1))  # could fill the socket's buffer
    assert broker.split(broker.submit, _quiet(big)) is None
    with pytest.raises(TaskNotFoundError):
        broker.get(big.id)
    assert len(_split(broker, broker.submit, _quiet(new_task(payload=b"x" * 1000))).statuses) == 1
    assert broker.split(broker.list, None) is None  # not a method split
    assert broker.split(len, "x") is None
    other = SQLBroker(postgresql_url)
    try:
        assert broker.split(other.get, "x") is None  # another broker's method
    finally:
        other.close()
    overriding = OverridesGet(postgresql_url)
    try:
        _ready(overriding)
        assert overriding.split(overriding.get, "x") is None
    finally:
        overriding.close()
    assert broker.split_names == ["submit"]


def test_a_traced_engine_sees_every_statement_because_nothing_is_split(broker: CountingSplits) -> None:
    _ready(broker)
    seen: list[str] = []

    def trace(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        seen.append(statement)

    event.listen(broker._engine, "before_cursor_execute", trace)
    try:
        assert broker.split(broker.claim, _claim("q", 1)) is None
        steps.claim(broker, "q", 1, TTL)
        assert any("SKIP LOCKED" in statement for statement in seen)
    finally:
        event.remove(broker._engine, "before_cursor_execute", trace)
    assert _split(broker, broker.claim, _claim("q", 1)).leases == []


@pytest.mark.parametrize(
    "options",
    [{"connect_args": {"prepare_threshold": None}}, {"paramstyle": "format"}],
    ids=["prepare_threshold=None", "paramstyle=format"],
)
def test_connections_told_to_prepare_nothing_split_nothing(
    postgresql_url: str, options: dict[str, Any]
) -> None:
    """``prepare_threshold=None`` (PgBouncer in transaction mode): a split call's PREPARE and
    EXECUTE could meet two server sessions. Nor does an engine whose placeholders are not the
    ``%(name)s`` ones split calls number for libpq."""
    engine = create_engine(normalize_url(postgresql_url), **options)
    unprepared = SQLBroker(engine)
    try:
        _ready(unprepared)
        (task,) = steps.enqueue(unprepared, [new_task()])
        assert unprepared.split(unprepared.get, task.id) is None
        taken = _held(unprepared).take()  # given back: free for the next call
        assert taken is not None
        _held(unprepared).give_back(taken)
        assert unprepared.get(task.id).id == task.id
    finally:
        unprepared.close()
        engine.dispose()


def test_a_busy_held_connection_leaves_the_call_to_a_thread(broker: CountingSplits) -> None:
    _ready(broker)
    (task,) = steps.enqueue(broker, [new_task()])
    with _held(broker).use():
        assert broker.split(broker.get, task.id) is None
    call = broker.split(broker.get, task.id)
    assert call is not None
    assert broker.split(broker.get, task.id) is None  # taken by the call in flight
    assert drive(call).id == task.id
    assert _split(broker, broker.get, task.id).id == task.id


def test_a_server_clock_due_for_a_reading_sends_nothing(broker: CountingSplits) -> None:
    _ready(broker)
    server_time, read_at = broker._server_clock._base or (None, 0.0)
    assert server_time is not None
    broker._server_clock._base = (server_time, read_at - RESYNC_SECONDS)  # an old reading
    assert broker.split(broker.claim, _claim("q", 1)) is None
    steps.claim(broker, "q", 1, TTL)  # a thread call reads the clock
    assert _split(broker, broker.claim, _claim("q", 1)).leases == []


def test_an_idle_held_connection_is_pinged_in_a_thread_first(broker: CountingSplits, monkeypatch) -> None:
    _ready(broker)
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE", 0.0)
    assert broker.split(broker.get, "x") is None
    monkeypatch.undo()
    assert _split(broker, broker.claim, _claim("q", 1)).leases == []


def test_a_connection_killed_under_a_split_call_fails_it_and_is_replaced(
    broker: CountingSplits, postgresql_url: str
) -> None:
    """The session ends while the statement waits on the server (a lock): the call fails with
    `BrokerError`, as the same call in a thread fails, and the next call opens another session."""
    _ready(broker)
    (task,) = steps.enqueue(broker, [new_task()])
    dead = _session(broker)
    with _LockedTasks(postgresql_url) as locked:
        call = broker.split(broker.claim, _claim("q", 1))
        assert call is not None
        locked.wait_for_waiter()
        admin = create_engine(normalize_url(postgresql_url))
        try:
            with admin.connect() as conn:
                conn.execute(text(f"SELECT pg_terminate_backend({dead})"))
        finally:
            admin.dispose()
        with pytest.raises(BrokerError, match="connection lost"):
            drive(call)
    assert _held(broker).take() is None  # discarded: the next call opens another, in a thread
    assert broker.get(task.id).status is Status.PENDING  # the claim changed nothing
    assert _session(broker) != dead
    assert broker._engine.pool.checkedout() == 0
    (lease,) = _split(broker, broker.claim, _claim("q", 1)).leases  # prepared again on the new session
    assert lease.task.id == task.id


def test_a_connection_left_mid_request_sends_the_call_to_a_thread_closed(broker: CountingSplits) -> None:
    """libpq still owes the reply of an earlier request (a session ended while a request was
    being sent can leave it so: test_sql_held_connection.py). Nothing can be sent: the split
    call leaves the method to a thread, the connection closed (not dropped open), and the
    thread opens another."""
    _ready(broker)
    (task,) = steps.enqueue(broker, [new_task()])
    with _held(broker).use() as conn:
        stuck = conn.connection.dbapi_connection
    stuck.pgconn.send_query(b"SELECT 1")  # its reply never read
    assert broker.split(broker.get, task.id) is None
    assert stuck.closed
    assert broker.get(task.id).status is Status.PENDING


def test_a_statement_the_server_forgot_is_prepared_again(broker: CountingSplits) -> None:
    _ready(broker)
    (task,) = steps.enqueue(broker, [new_task()])
    assert _split(broker, broker.get, task.id).id == task.id  # PREPARE, then EXECUTE
    with _held(broker).use() as conn:
        conn.exec_driver_sql("DEALLOCATE ALL")
    forgotten = broker.split(broker.get, task.id)
    assert forgotten is not None
    with pytest.raises(nowait.WouldBlock):
        drive(forgotten)
    assert _split(broker, broker.get, task.id).id == task.id


def test_a_failed_prepare_sends_the_call_to_a_thread_and_the_next_split_prepares_again(
    broker: CountingSplits,
) -> None:
    _ready(broker)
    (task,) = steps.enqueue(broker, [new_task()])
    with _held(broker).use() as conn:
        conn.exec_driver_sql("SET search_path TO pg_catalog")  # the tables out of sight
    refused = broker.split(broker.get, task.id)
    assert refused is not None
    with pytest.raises(nowait.WouldBlock):
        drive(refused)
    with _held(broker).use() as conn:
        conn.exec_driver_sql("RESET search_path")
    assert _split(broker, broker.get, task.id).id == task.id


class _RefusesBoom(TextLoader):
    """Reads text as psycopg does, but fails on the value ``boom`` (a reply that cannot be read)."""

    def load(self, data: Any) -> str:
        text = str(super().load(data))
        if text == "boom":
            raise psycopg.DataError("cannot read 'boom'")
        return text


def test_a_reply_that_cannot_be_read_fails_the_call_without_running_it_again(postgresql_url: str) -> None:
    """The statement ran: a claim's rows unread must not send the claim again to a thread."""
    engine = create_engine(normalize_url(postgresql_url))
    event.listen(
        engine, "connect", lambda driver, _: driver.adapters.register_loader("varchar", _RefusesBoom)
    )
    broker = CountingSplits(engine)
    try:
        _ready(broker)
        steps.enqueue(broker, [new_task(type="boom"), new_task(type="fine")])
        session = _session(broker)
        call = broker.split(broker.claim, _claim("q", 1))
        assert call is not None
        with pytest.raises(BrokerError, match="could not be read"):
            drive(call)
        reader = SQLBroker(postgresql_url)  # reads 'boom' as any text
        try:
            assert reader.counts() == {"boom": {Status.RUNNING: 1}, "fine": {Status.PENDING: 1}}  # once
        finally:
            reader.close()
        assert _session(broker) == session  # the session answered whole: kept
        (lease,) = _split(broker, broker.claim, _claim("q", 1)).leases
        assert lease.task.type == "fine"
    finally:
        broker.close()
        engine.dispose()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_splits_on_its_parent_s_connection(broker: CountingSplits) -> None:
    _ready(broker)
    child = os.fork()
    if child == 0:  # pragma: no cover -- the child reports through its exit status
        code = 1
        try:
            if broker.split(broker.get, "x") is None:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _split(broker, broker.claim, _claim("q", 1)).leases == []


def test_a_broker_on_another_database_needs_no_psycopg(tmp_path: Path) -> None:
    """psycopg is an optional dependency: split calls load it only for a psycopg engine."""
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    script = (
        "import sys\n"
        "sys.modules['psycopg'] = None  # as if not installed: importing it raises\n"
        "from taskgate.brokers.sql import SQLBroker\n"
        f"broker = SQLBroker({url!r})\n"
        "from taskgate.testing.contract._support import new_task\n"
        "from taskgate.testing import steps\n"
        "(task,) = steps.enqueue(broker, [new_task()])\n"
        "assert not broker.capabilities.split_calls and broker.get(task.id).id == task.id\n"
        "broker.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=GUARD * 4)
    assert done.returncode == 0, done.stderr


# -- the runtime's side ----------------------------------------------------------------------


class _LockedTasks:
    """Another session holds the task table locked: a claim's statement waits on the server."""

    def __init__(self, url: str) -> None:
        self._engine = create_engine(normalize_url(url))

    def __enter__(self) -> _LockedTasks:
        self._conn = self._engine.connect()
        self._conn.begin()
        self._conn.execute(text("LOCK TABLE taskgate_tasks IN ACCESS EXCLUSIVE MODE"))
        return self

    def wait_for_waiter(self) -> None:
        """Until another session waits for the lock (the statement is on the server)."""
        deadline = time.monotonic() + GUARD
        query = text(
            "SELECT count(*) FROM pg_locks WHERE relation = 'taskgate_tasks'::regclass AND NOT granted"
        )
        while not self._conn.execute(query).scalar_one():
            assert time.monotonic() < deadline, "no statement came to wait for the lock"
            time.sleep(0.005)  # another session's arrival: nothing to wait on but its lock row

    def __exit__(self, *exc: object) -> None:
        self._conn.rollback()
        self._conn.close()
        self._engine.dispose()


@pytest.mark.anyio
async def test_a_claim_past_its_deadline_hands_its_leases_to_on_abandoned(
    broker: CountingSplits, postgresql_url: str
) -> None:
    _ready(broker)
    steps.enqueue(broker, [new_task(), new_task()])
    calls = BrokerCalls(4, split=broker.split)
    late = LateLeases()
    with _LockedTasks(postgresql_url), pytest.raises(BrokerError, match="did not answer within"):
        await calls(broker.claim, _claim("q", 2), deadline=0.05, on_abandoned=late)
    assert broker.split_names == ["claim"]  # it was split, not run in a thread
    leases = late.wait()
    assert [lease.task.status for lease in leases] == [Status.RUNNING] * 2
    assert all(broker.get(lease.task.id).status is Status.RUNNING for lease in leases)
    assert await calls(broker.get, leases[0].task.id) == leases[0].task  # the connection is back


@pytest.mark.anyio
async def test_a_cancelled_wait_leaves_the_reply_to_a_thread(
    broker: CountingSplits, postgresql_url: str
) -> None:
    _ready(broker)
    task = new_task()
    steps.enqueue(broker, [task])
    calls = BrokerCalls(4, split=broker.split)
    late = LateLeases()
    with _LockedTasks(postgresql_url):
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: calls(broker.claim, _claim("q", 1), on_abandoned=late))
            with anyio.fail_after(GUARD):
                while not broker.split_names:  # the statement is out; the lock holds it
                    await anyio.lowlevel.checkpoint()
            group.cancel_scope.cancel()
    assert [lease.task.id for lease in late.wait()] == [task.id]
    assert await calls(broker.get, task.id) == late.leases[0].task
    assert broker.split_names == ["claim", "get"]


@pytest.mark.anyio
async def test_a_gate_submits_claims_and_reads_through_split_calls(broker: CountingSplits) -> None:
    gate = make_gate(broker, {"q": QueueConfig(workers=4)})
    done = anyio.Event()
    seen: list[str] = []

    @gate.handler("q")
    async def work(task: Task) -> str:
        seen.append(task.id)
        if len(seen) == 40:
            done.set()
        return task.id

    with anyio.fail_after(GUARD):
        ids = [await gate.submit("q") for _ in range(20)]  # the gate not started yet
        async with gate:
            ids += [await gate.submit("q") for _ in range(20)]
            await done.wait()
    assert sorted(seen) == sorted(ids)
    assert broker.counts()["q"] == {Status.COMPLETED: 40}
    # Submits go through split calls. A claim that finds a submit's statement in flight on the
    # held connection runs in a thread, which on a loaded host can be every claim of the run
    # (seen in CI); `test_a_claim_past_its_deadline_hands_its_leases_to_on_abandoned` shows a
    # claim split.
    assert "submit" in set(broker.split_names)


@pytest.mark.anyio
async def test_a_gate_submits_and_reads_a_task_through_split_calls(broker: CountingSplits) -> None:
    """A web process's submit and status read need no thread (the gate is not even started)."""
    _ready(broker)
    gate = make_gate(broker, {"q": QueueConfig(workers=1)})
    task_id = await gate.submit("q", b"payload")
    got = await gate.get(task_id)
    assert (got.id, got.status, got.payload) == (task_id, Status.PENDING, b"payload")
    assert broker.split_names == ["submit", "get"]
