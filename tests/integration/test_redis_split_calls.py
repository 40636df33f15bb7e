"""Redis calls split in two (`taskgate.brokers.split`): the request leaves from the event loop and
the loop reads the reply. They answer as the methods do, never wait on the loop, and a caller
that gives up leaves the reply to a thread, as a thread call abandoned by its waiter does."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Iterator

import anyio
import anyio.lowlevel
import pytest
import redis
from gate_helpers import GUARD, make_gate
from helpers.redis_servers import RedisServer, purge_keys
from helpers.split_calls import CountsSplits, LateLeases, drive

from taskgate import QueueConfig, Status, Task
from taskgate.brokers.base import Lease, NewTask
from taskgate.brokers.params import (
    Claim,
    Claimed,
    Complete,
    Heartbeat,
    QueueQuery,
    Requeue,
    Settle,
    Submit,
    Submitted,
)
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.brokers.redis.scripts import function_library
from taskgate.brokers.redis.split import LOOP_CLIENT_NAME, MAX_SPLIT_REQUEST, pack_request
from taskgate.errors import AlreadyFinalError, BrokerError, LeaseLostError, TaskNotFoundError
from taskgate.runtime.calls import BrokerCalls
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, new_task


class CountingSplits(CountsSplits, RedisBroker):
    """A RedisBroker that counts the calls it split and those it left to a thread."""


@pytest.fixture
def broker(redis_url: str, unique_prefix: str, client: redis.Redis) -> Iterator[CountingSplits]:
    opened = CountingSplits(redis_url, key_prefix=unique_prefix)
    yield opened
    opened.close()
    purge_keys(client, KeySpace(unique_prefix).pattern())


def _quiet(tasks: list[NewTask]) -> Submit:
    return Submit(tuple(tasks), snapshots=False)


def _ready(broker: RedisBroker) -> None:
    """Make sure an event-loop connection is open: a split call that finds none asks for one
    (sending nothing), and the next script run in a thread opens it."""
    assert broker.split(broker.submit, _quiet([new_task(queue="warm-up")])) is None
    steps.claim(broker, "warm-up", 1, TTL)


# -- the broker's side -----------------------------------------------------------------------


def test_split_calls_answer_as_their_methods_do(broker: CountingSplits) -> None:
    _ready(broker)
    task = new_task()
    submitted = broker.split(broker.submit, _quiet([task]))
    assert submitted is not None
    assert drive(submitted) == Submitted(statuses=[Status.PENDING])
    assert broker.get(task.id).status is Status.PENDING

    claimed = broker.split(broker.claim, Claim("q", 5, TTL))
    assert claimed is not None
    (lease,) = drive(claimed).leases
    assert isinstance(lease, Lease)
    assert lease.task.id == task.id and lease.task.status is Status.RUNNING

    renewed = broker.split(broker.heartbeat, Heartbeat(task.id, lease.token, TTL, slot_queue="q"))
    assert renewed is not None
    assert drive(renewed).slot_lost is True  # a plain claim holds no slot

    # A stale token answers its own item, as `settle` answers it.
    stale = broker.split(broker.settle, Settle((Requeue(task.id, "not-the-token"),)))
    assert stale is not None
    (lost,) = drive(stale)
    assert isinstance(lost, LeaseLostError)
    acked = broker.split(broker.settle, Settle((Complete(task.id, lease.token, b"done"),), snapshots=False))
    assert acked is not None
    assert drive(acked) == [None]
    assert broker.get(task.id).status is Status.COMPLETED
    assert broker.get(task.id).result == b"done"

    # A cancel answers the snapshot, or raises as `cancel` raises for a final task.
    other = new_task()
    steps.enqueue(broker, [other])
    canceled = broker.split(broker.cancel, other.id)
    assert canceled is not None
    assert drive(canceled).status is Status.CANCELED
    again = broker.split(broker.cancel, task.id)
    assert again is not None
    with pytest.raises(AlreadyFinalError):
        drive(again)


def test_a_split_get_answers_the_snapshot_or_raises_as_get_does(broker: CountingSplits) -> None:
    """`get` is a plain ``HMGET``, not a script: split, it answers what `get` answers."""
    _ready(broker)
    (task,) = steps.enqueue(broker, [new_task(payload=b"p")])
    call = broker.split(broker.get, task.id)
    assert call is not None
    assert drive(call) == broker.get(task.id)
    missing = broker.split(broker.get, "no-such-task")
    assert missing is not None
    with pytest.raises(TaskNotFoundError, match="no-such-task"):
        drive(missing)
    with pytest.raises(ValueError, match="task id"):
        broker.split(broker.get, "")  # checked before anything is sent


@pytest.mark.anyio
async def test_a_gate_reads_a_task_through_a_split_get(broker: CountingSplits) -> None:
    """A status endpoint's `gate.get` needs no thread (the gate is not even started)."""
    _ready(broker)
    gate = make_gate(broker, {"q": QueueConfig(workers=1)})
    task_id = await gate.submit("q", b"payload")
    broker.split_names.clear()
    got = await gate.get(task_id)
    assert (got.id, got.status, got.payload) == (task_id, Status.PENDING, b"payload")
    assert broker.split_names == ["get"]


def test_a_reply_bigger_than_one_read_is_read_whole(broker: CountingSplits) -> None:
    _ready(broker)
    payload = bytes(range(256)) * 64  # 16 KiB per task: the claim's reply is ~800 KiB
    ids = [task.id for task in steps.enqueue(broker, [new_task(payload=payload) for _ in range(50)])]
    call = broker.split(broker.claim, Claim("q", 50, TTL))
    assert call is not None
    reads = 0
    while True:
        readable, _, _ = select.select([call.fileno()], [], [], GUARD)
        assert readable
        reads += 1
        if call.receive():
            break
    leases = call.result().leases
    assert reads > 1
    assert sorted(lease.task.id for lease in leases) == sorted(ids)
    assert all(lease.task.payload == payload for lease in leases)


def test_bad_arguments_raise_before_anything_is_sent(broker: CountingSplits) -> None:
    _ready(broker)
    with pytest.raises(ValueError, match="task id"):
        broker.split(broker.get, "x" * 256)
    # The connection went back unused: the next call has it.
    assert broker.split(broker.submit, _quiet([new_task()])) is not None


class OverridesClaim(RedisBroker):
    def claim(self, claim: Claim) -> Claimed:
        return super().claim(claim)


def test_what_is_not_split_sends_nothing(broker: CountingSplits, redis_url: str) -> None:
    _ready(broker)
    big = new_task(payload=b"x" * (MAX_SPLIT_REQUEST + 1))
    assert broker.split(broker.submit, _quiet([big])) is None
    with pytest.raises(TaskNotFoundError):
        broker.get(big.id)
    assert broker.split(broker.submit, _quiet([])) is None  # nothing to send at all
    assert broker.split(broker.list, None) is None  # a method it does not split
    assert broker.split(lambda *a: None, "q") is None  # not a broker method at all
    other = OverridesClaim(redis_url, key_prefix=broker.key_prefix)
    try:
        _ready(other)
        assert broker.split(other.claim, Claim("q", 1, TTL)) is None  # another broker's method
        # A subclass's override is the subclass's to run: whole, in a thread.
        assert other.split(other.claim, Claim("q", 1, TTL)) is None
        assert other.split(other.submit, _quiet([new_task()])) is not None
    finally:
        other.close()


def test_an_idle_connection_the_server_closed_is_dropped_before_it_takes_a_request(
    private_redis: RedisServer,
) -> None:
    broker = CountingSplits(private_redis.url)
    client = redis.Redis.from_url(private_redis.url)
    try:
        _ready(broker)
        client.client_kill_filter(_type="normal", skipme=True)
        task = new_task()
        # The dead connection is noticed before any request goes into it: nothing is sent.
        assert broker.split(broker.submit, _quiet([task])) is None
        with pytest.raises(TaskNotFoundError):
            broker.get(task.id)
        broker.submit(_quiet([task]))  # the thread path reconnects, and opens a new loop connection
        again = broker.split(broker.claim, Claim("q", 1, TTL))
        assert again is not None
        assert [lease.task.id for lease in drive(again).leases] == [task.id]
    finally:
        broker.close()
        client.close()


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD
    while not condition():
        assert time.monotonic() < deadline, "never came true"
        time.sleep(0.005)  # another process's state: nothing to wait on but asking again


def _loop_clients(client: redis.Redis) -> int:
    return sum(1 for info in client.client_list() if info.get("name") == LOOP_CLIENT_NAME)


def test_closing_the_broker_closes_its_event_loop_connections(private_redis: RedisServer) -> None:
    client = redis.Redis.from_url(private_redis.url)
    broker = RedisBroker(private_redis.url)
    try:
        _ready(broker)
        assert _loop_clients(client) == 1
        broker.close()
        _until(lambda: _loop_clients(client) == 0)  # the server sees the close a moment later
        with pytest.raises(BrokerError, match="closed"):
            broker.split(broker.claim, Claim("q", 1, TTL))
    finally:
        broker.close()
        client.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_never_uses_its_parent_s_event_loop_connections(broker: CountingSplits) -> None:
    _ready(broker)
    pid = os.fork()
    if pid == 0:  # the child: the parent's idle connection must not be taken
        code = 0 if broker.split(broker.submit, _quiet([new_task()])) is None else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's connection carried no request of the child's: its next call answers its own.
    task = new_task()
    call = broker.split(broker.submit, _quiet([task]))
    assert call is not None
    assert drive(call).statuses == [Status.PENDING]
    assert broker.get(task.id).status is Status.PENDING


def test_a_server_without_the_function_library_answers_would_block_having_run_nothing(
    private_redis: RedisServer,
) -> None:
    from taskgate.brokers.nowait import WouldBlock

    broker = CountingSplits(private_redis.url)
    client = redis.Redis.from_url(private_redis.url)
    try:
        _ready(broker)
        client.function_delete(function_library().name)
        task = new_task()
        call = broker.split(broker.submit, _quiet([task]))
        assert call is not None
        with pytest.raises(WouldBlock):
            drive(call)
        with pytest.raises(TaskNotFoundError):
            broker.get(task.id)
        assert broker.submit(_quiet([task])).statuses == [Status.PENDING]  # the thread path loads it again
    finally:
        broker.close()
        client.close()


# -- the runtime's side ----------------------------------------------------------------------


class _Paused:
    """The server holds every write command (an FCALL of a writing function) until released."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def __enter__(self) -> _Paused:
        self._client.execute_command("CLIENT", "PAUSE", int(GUARD * 1000), "WRITE")
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.execute_command("CLIENT", "UNPAUSE")


@pytest.mark.anyio
async def test_a_claim_past_its_deadline_hands_its_leases_to_on_abandoned(
    broker: CountingSplits, client: redis.Redis
) -> None:
    _ready(broker)
    steps.enqueue(broker, [new_task(), new_task()])
    calls = BrokerCalls(4, split=broker.split)
    late = LateLeases()
    with _Paused(client), pytest.raises(BrokerError, match="did not answer within"):
        await calls(broker.claim, Claim("q", 2, TTL), deadline=0.05, on_abandoned=late)
    assert broker.split_names == ["claim"]  # it was split, not run in a thread
    leases = late.wait()
    assert [lease.task.status for lease in leases] == [Status.RUNNING] * 2
    assert all(broker.get(lease.task.id).status is Status.RUNNING for lease in leases)


@pytest.mark.anyio
async def test_a_cancelled_wait_leaves_the_reply_to_a_thread(
    broker: CountingSplits, client: redis.Redis
) -> None:
    _ready(broker)
    task = new_task()
    steps.enqueue(broker, [task])
    calls = BrokerCalls(4, split=broker.split)
    late = LateLeases()
    with _Paused(client):
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: calls(broker.claim, Claim("q", 1, TTL), on_abandoned=late))
            with anyio.fail_after(GUARD):
                while not broker.split_names:  # the request is out; the paused server holds it
                    await anyio.lowlevel.checkpoint()
            group.cancel_scope.cancel()
    assert [lease.task.id for lease in late.wait()] == [task.id]
    # The connection went back once the thread read the reply: the next split call has one.
    assert (await calls(broker.queue_state, QueueQuery("q"))).queue_len == 0
    assert broker.split(broker.submit, _quiet([new_task()])) is not None


@pytest.mark.anyio
async def test_a_gate_submits_claims_and_acks_through_split_calls(broker: CountingSplits) -> None:
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
        async with gate:
            ids = [await gate.submit("q") for _ in range(40)]
            await done.wait()
    assert sorted(seen) == sorted(ids)
    assert broker.counts()["q"] == {Status.COMPLETED: 40}
    names = set(broker.split_names)
    assert {"submit", "claim"} <= names
    # Only the first calls, before a loop connection was open, went to a thread.
    assert broker.unsplit <= len(broker.split_names) // 4


def test_a_request_is_packed_as_redis_py_packs_it_whatever_its_arguments(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url).connection_pool.make_connection()
    request = ("FCALL", "f", 1, "k{1}", "ünï 中文 🙂", b"\x00\r\n\xff", "", b"", 0, -17, 2**62, 1.5, 0.3)
    assert b"".join(pack_request(connection, request)) == b"".join(connection.pack_command(*request))
    # What hiredis refuses, redis-py converts (a buffer) or names (anything else).
    as_buffer = pack_request(connection, ("SET", "k", bytearray(b"v")))
    assert as_buffer == pack_request(connection, ("SET", "k", b"v"))
    with pytest.raises(redis.DataError):
        pack_request(connection, ("SET", "k", None))
